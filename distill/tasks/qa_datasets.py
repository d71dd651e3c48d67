"""QA tasks from `datasets`: a dataset spec names a hub dataset or a local file, a split and a field
mapping; `get_task(spec)` turns it into a `QATask` (see `distill.tasks.qa` for prompts, option
shuffling and answer extraction).

A spec is one string, so it fits wherever a task name does (`data.task`, `data.val_tasks`,
`data.test_tasks`, the callbacks' task lists)::

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
- `seed` (default 0): fixes the held-out subsets and the option shuffling.

Examples: ``sciq:data/sciq_train.jsonl``, ``medreason:`` (the hub's UCSC-VLAA/MedReason),
``qa:exam.csv?question=stem&correct=key&distractors=w1,w2,w3&test=100``.

Presets:

- `sciq` (`allenai/sciq`): question, correct_answer, distractor1, distractor2, distractor3, support
  (the reference reasoning).
- `medreason` (`UCSC-VLAA/MedReason`): question, options, answer, reasoning (plus dataset_name and
  id_in_dataset, unused). Assumed from the dataset's published feature list (derived copies such as
  MedReason-RL list the same fields): `options` is one string of lettered lines (``A. …``, possibly
  after an ``Answer Choices:`` header, empty for open questions) and `answer` is the correct
  option's text or letter. Rows whose answer matches no option are skipped (`QATask.skipped`); rows
  without options are free-form questions.

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
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

from distill.checks import check, check_choice, check_int
from distill.tasks import qa

PARTS = ("train", "val", "test")
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
MAPPING_KEYS = ("question", "options", "answer", "correct", "distractors", "reasoning")
SPEC_KEYS = ("split", *MAPPING_KEYS, "val", "test", "seed")


@dataclass(frozen=True)
class Preset:
    hub: str
    mapping: dict


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
    ),
}
KINDS = (*PRESETS, "qa")
_OPTION_LINE = re.compile(r"^\s*[\(\[]?([A-Za-z])[\)\]]?\s*[.:)]\s*(.+?)\s*$")
_OPTION_BARE = re.compile(r"^\s*\(([A-Za-z])\)\s*(.+?)\s*$")


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
    return Spec(kind, source, options.get("split") or "train", mapping, size("val"), size("test"), seed)


def load_rows(source: str, split: str):
    """The dataset at `source` (hub id or local file), one split, via `datasets.load_dataset`."""
    from datasets import load_dataset

    builder = FILE_BUILDERS.get(Path(source).suffix.lower())
    if builder is not None:
        path = Path(source).expanduser()
        check(path.is_file(), "data.task source", source, "an existing local file")
        return load_dataset(builder, data_files={split: str(path)}, split=split)
    return load_dataset(source, split=split)


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


def gold_index(value, options: list[str]) -> int | None:
    """Which option `value` (a letter, a 0-based index, the option's text) names; None if none."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if 0 <= value < len(options) else None
    found = qa.resolve(str(value), options)
    return None if found is None else qa.LETTERS.index(found)


@dataclass(frozen=True)
class Item:
    question: str
    options: tuple[str, ...]  # shuffled; empty for free form
    answer_index: int | None
    answer_text: str
    reasoning: str
    source_index: int


@dataclass(frozen=True, eq=False)
class QATask:
    """A multiple-choice / free-form QA task over a loaded dataset (see the module docstring)."""

    name: str  # `task_name(spec)`: slash-free, for metric keys
    items: tuple[Item, ...]
    parts: dict = field(repr=False)  # part -> tuple of item indices
    skipped: int = 0
    spec: str = ""

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
    items, skipped = [], 0
    for index, record in enumerate(data):
        question = str(record[mapping["question"]] or "").strip()
        reasoning = str(record.get(mapping.get("reasoning", ""), "") or "") if "reasoning" in mapping else ""
        if "correct" in mapping:
            correct = str(record[mapping["correct"]] or "").strip()
            wrong = [str(record[f] or "").strip() for f in mapping["distractors"].split(",")]
            options, answer = [correct, *[w for w in wrong if w]], 0
        else:
            options = parse_options(record[mapping["options"]]) if "options" in mapping else []
            raw = record[mapping["answer"]]
            answer = gold_index(raw, options) if options else None
            if options and answer is None:
                skipped += 1
                continue
        unusable = len(options) > qa.MAX_OPTIONS or (options and not options[answer])
        if (
            unusable
            or not question
            or (not options and not str(record.get(mapping.get("answer", ""), "") or "").strip())
        ):
            skipped += 1
            continue
        if options:
            shuffled = qa.shuffle_options(question, options, answer, parsed.seed)
            item = Item(
                question, tuple(shuffled.options), shuffled.answer_index, options[answer], reasoning, index
            )
        else:
            text = str(record[mapping["answer"]]).strip()
            item = Item(question, (), None, text, reasoning, index)
        items.append(item)
    check(
        bool(items),
        f"data.task {spec!r}",
        f"{len(data)} records, {skipped} skipped",
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
    return QATask(task_name(spec), tuple(items), parts, skipped, spec)


LOADED: dict[str, QATask] = {}  # task name -> task, for `get_task(task.name)` after loading


@functools.lru_cache(maxsize=32)
def get_qa_task(spec: str) -> QATask:
    """The task of a spec, loaded once per process; afterwards also found by its `name`."""
    task = build(spec)
    LOADED[task.name] = task
    return task
