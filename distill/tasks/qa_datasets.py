"""QA tasks from `datasets`: a dataset spec names a hub dataset or a local file, a split and a field
mapping; `get_task(spec)` turns it into a `QATask` (see `distill.tasks.qa` for prompts, option
shuffling and answer extraction).

A spec is one string, so it fits wherever a task name does (`data.task`, `data.evaluation.val_tasks`,
`data.evaluation.test_tasks`, the callbacks' task lists)::

    <kind>:<source>[?key=value&key=value...]

`kind` is a preset (`sciq`, `medreason`) or `qa` (no preset: give the mapping). `source` is a hub id
or a local `.json`/`.jsonl`/`.parquet`/`.csv` file (loaded with `datasets.load_dataset("json"|
"parquet"|"csv", data_files=...)`); empty: the preset's hub id. Keys:

- `split` (default `train`): the split loaded (a local file is loaded as this split);
- `question`, `options`, `answer`, `correct`, `distractors` (comma-separated), `reasoning`: the
  field mapping, overriding the preset's. Options come from `options` (a list, a dict keyed by
  letter, or a string of ``A. text`` lines) with `answer` (a letter, a 0-based index, or the
  option's text), or from `correct` plus `distractors`; with neither, `answer` is a free-form text;
- `val`, `test`: sizes of the held-out subsets (defaults: min(200, 10 %) and min(500, 20 %));
- `seed` (default 0): fixes the held-out subsets and the option shuffling;
- `free_form` (`exact`, or `drop`: the `medreason` default): rows without options are scored by
  exact match of the normalised text, or left out (`QATask.dropped`);
- `max_skipped_share` (default 0.05): the largest share of the split's rows (those not dropped)
  that may be unscorable (no question or answer, options not lettered A, B, C…, an answer naming
  no option); above it loading refuses, saying how many and why: a metric over the rest would
  quietly measure another set. Skipped rows are counted per reason (`QATask.skip_reasons`), and
  `row_metrics` gives a run's loggers `data/<task>/skipped_rows`, `…/skipped_share`, `…/dropped_rows`.

Examples: ``sciq:data/sciq_train.jsonl``, ``medreason:`` (the hub's UCSC-VLAA/MedReason),
``qa:exam.csv?question=stem&correct=key&distractors=w1,w2,w3&test=100``.

Presets:

- `sciq` (`allenai/sciq`): question, correct_answer, distractor1, distractor2, distractor3, support
  (the reference reasoning).
- `medreason` (`UCSC-VLAA/MedReason`): question, options, answer, reasoning (plus dataset_name and
  id_in_dataset, unused), as its feature list and rows show: `options` is one string of lettered
  lines (``A. …`` or ``A.: …``, maybe after an ``Answer Choices:`` header; empty for open
  questions); `answer` is the correct option's text, that text then ``. Explanation: …`` (the
  MedMCQA rows), a letter (``B``, ``B) text``, "The answer is B") or "The final decision is: yes"
  (PubMedQA style): `gold_index` reads each; `read` turns each record into an `Item` or says why it is not one. Rows without options (free text, e.g. the
  HuatuoGPT-o1 rows) are dropped: exact match would score them near 0, and MedReason accuracy is
  reported on its multiple-choice questions.

The loaded rows are split once, by `seed`: a fixed test subset, a fixed validation subset, and the
rest for training (disjoint). `rows(n, seed, part)` draws from one part: `train` shuffled by `seed`,
`val`/`test` always their first `n` rows (so every evaluation sees the same questions). A part
holds at most its size: asking for more returns all of it.

A task's `name` (its metric keys: `val/<name>/accuracy`) is `task_name(spec)`, slash-free, e.g.
``sciq-sciq_train-1a2b3c``; once the spec is loaded, `get_task` finds the task by that name too.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

from distill.checks import check, check_choice, check_int
from distill.tasks import qa

DROPPED = "dropped"  # `read`'s answer for a row left out on purpose (`free_form=drop`)

_OPTION_LINE = re.compile(r"^\s*[\(\[]?([A-Za-z])[\)\]]?\s*[.:)][.:]?\s*(.+?)\s*$")  # "A. x", "A.: x"
_OPTION_BARE = re.compile(r"^\s*\(([A-Za-z])\)\s*(.+?)\s*$")
_EXPLANATION = re.compile(r"\bexplanation[ \t]*:", re.I)  # MedMCQA's "<option>. Explanation: …"
_LONE_LETTER = re.compile(r"[(\[]?[ \t]*[A-Za-z][ \t]*[)\]]?[ \t]*[.:)]?")
_DECISION = re.compile(r"\bdecision[ \t]+is[ \t]*:?[ \t*]*(yes|no|maybe)\b", re.I)  # PubMedQA's


def parse_options(value) -> list[str]:
    """A list, a dict keyed by letter, or a string of lettered lines -> the option texts, in order."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [str(value[k]).strip() for k in sorted(value) if value[k] is not None]
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    found: dict[str, str] = {}
    for line in str(value).splitlines():
        match = _OPTION_LINE.match(line) or _OPTION_BARE.match(line)
        if match and match.group(1).upper() not in found:
            found[match.group(1).upper()] = match.group(2)
    letters = sorted(found)
    if letters != list(qa.LETTERS[: len(letters)]):  # not A, B, C, … in sequence: not options
        return []
    return [found[k] for k in letters]


def _by_text(text: str, options: list[str]) -> int | None:
    """The one option whose normalised text is `text`'s; None if none or several."""
    found = [i for i, option in enumerate(options) if qa.normalise(option) == qa.normalise(text)]
    return found[0] if len(found) == 1 else None


def gold_index(value, options: list[str]) -> int | None:
    """Which option `value` names; None if none (or several). `value` is a 0-based index, or a text:
    the option's text, that text then an explanation ("Colle's fascia. Explanation: …"), a letter
    ("B", "(B)", "B. text", "B) text", "option B", "The answer is B"), or a PubMedQA decision ("The
    final decision is: yes"). Texts are tried first, so an option written "E. coli" is not E."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if 0 <= value < len(options) else None
    text = str(value).strip()
    head = _EXPLANATION.split(text, maxsplit=1)[0].strip()
    decision = _DECISION.search(head)
    # A lone letter is a letter even where an option reads "A" (blood groups): datasets that give
    # letters are many, and that was always its reading.
    for said in () if _LONE_LETTER.fullmatch(text) else (text, head, decision and decision.group(1)):
        found = _by_text(said, options) if said else None
        if found is not None:
            return found
    found = qa.resolve(head, options) if head else None
    return None if found is None else qa.LETTERS.index(found)


@dataclass(frozen=True)
class Item:
    question: str
    options: tuple[str, ...]  # shuffled; empty for free form
    answer_index: int | None
    answer_text: str
    reasoning: str
    source_index: int


def _text(value) -> str:
    return str(value if value is not None else "").strip()


def read(record: dict, index: int, mapping: dict, parsed: Spec) -> Item | str:
    """A record as an `Item`, or why it is not one: `DROPPED`, or the reason it cannot be scored."""
    question = _text(record[mapping["question"]])
    reasoning = _text(record.get(mapping["reasoning"])) if "reasoning" in mapping else ""
    if not question:
        return "no question"
    if "correct" in mapping:
        correct = _text(record[mapping["correct"]])
        wrong = [_text(record[f]) for f in mapping["distractors"].split(",")]
        options, answer = [correct, *[w for w in wrong if w]], 0
        if not correct:
            return "no answer"
    else:
        given = record[mapping["options"]] if "options" in mapping else None
        options, raw = parse_options(given), record[mapping["answer"]]
        if not options and (given if isinstance(given, (list, tuple, dict)) else _text(given)):
            return "options not lettered A, B, C..."
        if not options and not _text(raw):
            return "no answer"
        if not options and parsed.free_form == "drop":
            return DROPPED
        if not options:
            return Item(question, (), None, _text(raw), reasoning, index)
        answer = gold_index(raw, options)
        if answer is None:
            return "answer names no option"
    if len(options) > qa.MAX_OPTIONS:
        return f"more than {qa.MAX_OPTIONS} options"
    shuffled = qa.shuffle_options(question, options, answer, parsed.seed)
    return Item(question, tuple(shuffled.options), shuffled.answer_index, options[answer], reasoning, index)


PARTS = ("train", "val", "test")
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
MAPPING_KEYS = ("question", "options", "answer", "correct", "distractors", "reasoning")
SPEC_KEYS = ("split", *MAPPING_KEYS, "val", "test", "seed", "free_form", "max_skipped_share")
FREE_FORM = ("exact", "drop")
MAX_SKIPPED_SHARE = 0.05


@dataclass(frozen=True)
class Preset:
    hub: str
    mapping: dict
    defaults: dict = field(default_factory=dict)  # spec keys other than the mapping


PRESETS: dict[str, Preset] = {
    "sciq": Preset(
        "allenai/sciq",
        {
            "question": "question",
            "correct": "correct_answer",
            "distractors": "distractor1,distractor2,distractor3",
            "reasoning": "support",
        },
    ),
    "medreason": Preset(
        "UCSC-VLAA/MedReason",
        {"question": "question", "options": "options", "answer": "answer", "reasoning": "reasoning"},
        {"free_form": "drop"},
    ),
}
KINDS = (*PRESETS, "qa")


def task_name(spec: str) -> str:
    """The name a spec's task logs under (metric keys are `<split>/<task>/<metric>`, so no "/"):
    ``<kind>-<file stem or hub name>-<6 hex of the whole spec>``, e.g. ``sciq-sciq-1a2b3c``."""
    kind, rest = spec.split(":", 1)
    source = rest.partition("?")[0].strip() or (PRESETS[kind].hub if kind in PRESETS else "")
    stem = Path(source).stem if Path(source).suffix.lower() in FILE_BUILDERS else source.rsplit("/", 1)[-1]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)[:40] or "data"
    return f"{kind}-{stem}-{hashlib.sha256(spec.encode()).hexdigest()[:6]}"


def is_spec(name: object) -> bool:
    """Whether `name` is written as a dataset spec (``<kind>:…``); it is checked when loaded."""
    return isinstance(name, str) and name.split(":", 1)[0] in KINDS and ":" in name


@dataclass(frozen=True)
class Spec:
    kind: str
    source: str
    split: str
    mapping: dict
    val: int | None
    test: int | None
    seed: int
    free_form: str = "exact"
    max_skipped_share: float = MAX_SKIPPED_SHARE


def parse_spec(spec: str) -> Spec:
    """``<kind>:<source>[?key=value&...]`` -> a `Spec` (see the module docstring)."""
    check(
        is_spec(spec),
        "data.task",
        spec,
        f"a task name or a dataset spec '<kind>:<source>' with kind in {list(KINDS)}",
    )
    kind, rest = spec.split(":", 1)
    source, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False)) if query else {}
    for key in options:
        check_choice(f"data.task {spec!r} key", key, SPEC_KEYS)
    mapping = dict(PRESETS[kind].mapping) if kind in PRESETS else {}
    mapping.update({k: v for k, v in options.items() if k in MAPPING_KEYS})
    mapping = {k: v for k, v in mapping.items() if v}
    source = source.strip() or (PRESETS[kind].hub if kind in PRESETS else "")
    check(
        bool(source),
        f"data.task {spec!r} source",
        source,
        "a hub id or a local file (the qa kind has no default)",
    )
    check(
        "question" in mapping,
        f"data.task {spec!r} question",
        None,
        "a field name (the qa kind needs question=…)",
    )
    check(
        "answer" in mapping or "correct" in mapping,
        f"data.task {spec!r} answer",
        None,
        "a field name: answer=… (with or without options=…), or correct=… with distractors=…",
    )
    if "correct" in mapping:
        check(
            "distractors" in mapping, f"data.task {spec!r} distractors", None, "field names, comma-separated"
        )

    def size(key: str) -> int | None:
        if key not in options:
            return None
        value = options[key]
        check(value.isdigit(), f"data.task {spec!r} {key}", value, "an integer >= 0")
        return int(value)

    seed = size("seed") or 0
    settings = {**(PRESETS[kind].defaults if kind in PRESETS else {}), **options}
    free_form = check_choice(f"data.task {spec!r} free_form", settings.get("free_form", "exact"), FREE_FORM)
    share = settings.get("max_skipped_share", str(MAX_SKIPPED_SHARE))
    try:
        max_share = float(share)
    except ValueError:
        max_share = math.nan
    check(0 <= max_share <= 1, f"data.task {spec!r} max_skipped_share", share, "a number in [0, 1]")
    split = options.get("split") or "train"
    return Spec(kind, source, split, mapping, size("val"), size("test"), seed, free_form, max_share)


def load_rows(source: str, split: str):
    """The dataset at `source` (hub id or local file), one split, via `datasets.load_dataset`."""
    from datasets import load_dataset

    builder = FILE_BUILDERS.get(Path(source).suffix.lower())
    if builder is not None:
        path = Path(source).expanduser()
        check(path.is_file(), "data.task source", source, "an existing local file")
        return load_dataset(builder, data_files={split: str(path)}, split=split)
    return load_dataset(source, split=split)


@dataclass(frozen=True, eq=False)
class QATask:
    """A multiple-choice / free-form QA task over a loaded dataset (see the module docstring)."""

    name: str  # `task_name(spec)`: slash-free, for metric keys
    items: tuple[Item, ...]
    parts: dict = field(repr=False)  # part -> tuple of item indices
    skipped: int = 0  # rows of the split that cannot be scored
    spec: str = ""
    dropped: int = 0  # rows left out on purpose (`free_form=drop`)
    skip_reasons: dict = field(default_factory=dict, repr=False)  # why rows were skipped -> count

    @property
    def skipped_share(self) -> float:
        """The share of the split's rows, those not left out on purpose, that cannot be scored."""
        considered = len(self.items) + self.skipped
        return self.skipped / considered if considered else 0.0

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the options over every item (free-form questions
        count 0); what a run logs is the same over the rows it evaluated (`qa.chance` per row)."""
        if not self.items:
            return 0.0
        return sum(qa.chance(i.options) for i in self.items) / len(self.items)

    def _row(self, item: Item) -> dict:
        options = list(item.options)
        answer = qa.letter(item.answer_index) if options else item.answer_text
        return {
            "prompt": qa.prompt(item.question, options),
            "messages": qa.chat_messages(item.question, options),
            "question": item.question,
            "options": options,
            "answer": answer,
            "answer_text": item.answer_text,
            "reasoning": item.reasoning,  # the dataset's own reasoning: privileged teacher context
            "reference": qa.reference(item.reasoning, options, item.answer_index, item.answer_text),
            "source_index": item.source_index,
        }

    def rows(self, n: int, seed: int, part: str = "val") -> list[dict]:
        check_int("n", n, 0)
        check_choice("part", part, PARTS)
        indices = list(self.parts[part])
        if part == "train":
            random.Random(f"qa-train/{seed}").shuffle(indices)
        return [self._row(self.items[i]) for i in indices[:n]]

    def score(self, completion: str, row: dict) -> float:
        return qa.score(completion, row["options"], row["answer"])

    answer_uses_row = True  # `TaskEvaluation` passes the row, so option texts resolve to letters

    def answer(self, completion: str, row: dict | None = None) -> str | None:
        """The extracted answer: the option's letter given the row's options; without a row, the
        answer as written (normalised)."""
        return qa.extract(completion, row["options"] if row is not None else ())


def build(spec: str) -> QATask:
    parsed = parse_spec(spec)
    data = load_rows(parsed.source, parsed.split)
    columns = list(data.column_names)
    mapping = parsed.mapping
    needed = [(k, f) for k, v in mapping.items() for f in (v.split(",") if k == "distractors" else [v])]
    for key, name in needed:
        check(name in columns, f"data.task {spec!r} {key}", name, f"a field of the dataset, one of {columns}")
    items, reasons, dropped = [], {}, 0
    for index, record in enumerate(data):
        found = read(record, index, mapping, parsed)
        if isinstance(found, Item):
            items.append(found)
        elif found == DROPPED:
            dropped += 1
        else:
            reasons[found] = reasons.get(found, 0) + 1
    skipped = sum(reasons.values())
    considered = len(items) + skipped
    share = skipped / considered if considered else 0.0
    if share > parsed.max_skipped_share:
        why = ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        raise ValueError(
            f"data.task {spec!r}: {skipped} of {considered} rows of split {parsed.split!r} ({share:.1%}) "
            f"cannot be scored ({why}), more than max_skipped_share={parsed.max_skipped_share:g} "
            "allows; check the field mapping, or raise max_skipped_share in the spec"
        )
    check(
        bool(items),
        f"data.task {spec!r}",
        f"{len(data)} records, {skipped} skipped, {dropped} dropped",
        "a dataset with usable rows",
    )
    order = list(range(len(items)))
    random.Random(f"qa-holdout/{parsed.seed}").shuffle(order)
    n_test = parsed.test if parsed.test is not None else min(500, len(items) // 5)
    n_val = parsed.val if parsed.val is not None else min(200, len(items) // 10)
    check(
        n_test + n_val < len(items),
        f"data.task {spec!r} val+test",
        n_test + n_val,
        f"< the {len(items)} usable rows",
    )
    parts = {
        "test": tuple(order[:n_test]),
        "val": tuple(order[n_test : n_test + n_val]),
        "train": tuple(order[n_test + n_val :]),
    }
    return QATask(task_name(spec), tuple(items), parts, skipped, spec, dropped, reasons)


def row_metrics(tasks) -> dict[str, float]:
    """What a run logs of the QA tasks among `tasks`: ``data/<task>/skipped_rows`` (rows of its
    split that cannot be scored), ``…/skipped_share`` and ``…/dropped_rows`` (left out on purpose)."""
    metrics = {}
    for task in tasks:
        if isinstance(task, QATask):
            metrics[f"data/{task.name}/skipped_rows"] = float(task.skipped)
            metrics[f"data/{task.name}/skipped_share"] = task.skipped_share
            metrics[f"data/{task.name}/dropped_rows"] = float(task.dropped)
    return metrics


LOADED: dict[str, QATask] = {}  # task name -> task, for `get_task(task.name)` after loading


@functools.lru_cache(maxsize=32)
def get_qa_task(spec: str) -> QATask:
    """The task of a spec, loaded once per process; afterwards also found by its `name`."""
    task = build(spec)
    LOADED[task.name] = task
    return task
