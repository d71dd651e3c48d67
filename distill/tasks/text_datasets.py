"""Held-out text from `datasets`, for retention sets scored by negative log-likelihood
(`distill.callbacks.Forgetting`'s `nll_texts`). A text spec is one string, in the form of the QA
dataset specs (`distill.tasks.qa_datasets`)::

    text:<source>?field=<name>[&split=…&rows=…&seed=…&config=…]

`source` is a hub id or a local `.json`/`.jsonl`/`.parquet`/`.csv` file; keys:

- `field` (required): the column holding the text (e.g. SciQ's `support`, MedReason's `reasoning`);
- `split` (default `train`): the split loaded (a local file is loaded as this split);
- `rows` (default 200): how many texts are kept;
- `seed` (default 0): which rows: a seeded permutation of the split, blank texts skipped;
- `config`: the hub dataset's configuration name (e.g. ``wikitext-103-raw-v1``), if it has several.

Example: ``text:allenai/sciq?field=support&split=test&rows=200``. `select(n, exclude)` returns the
texts of the first `n` rows of the permutation that are not in `exclude` (source row indices), so a
caller can keep the set disjoint from the rows a run trains on.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from urllib.parse import parse_qsl

from distill.checks import check, check_choice
from distill.tasks.qa_datasets import FILE_BUILDERS, load_rows

KIND = "text"
KEYS = ("field", "split", "rows", "seed", "config")
DEFAULT_ROWS = 200


def is_text_spec(value: object) -> bool:
    """Whether `value` is written as a text spec (``text:…``); it is checked when loaded."""
    return isinstance(value, str) and value.startswith(f"{KIND}:")


@dataclass(frozen=True)
class TextSpec:
    source: str
    field: str
    split: str
    rows: int
    seed: int
    config: str | None


def parse_text_spec(spec: str, owner: str = "text spec") -> TextSpec:
    """``text:<source>?field=…&…`` -> a `TextSpec`; `owner` names the option in errors."""
    check(is_text_spec(spec), owner, spec, "a text spec 'text:<source>?field=<name>[&split=…&rows=…]'")
    source, _, query = spec[len(KIND) + 1 :].partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    for key in options:
        check_choice(f"{owner} {spec!r} key", key, KEYS)
    source = source.strip()
    check(bool(source), f"{owner} {spec!r} source", source, "a hub id or a local file")
    check(bool(options.get("field")), f"{owner} {spec!r} field", None, "the name of the text column")

    def number(key: str, default: int, least: int) -> int:
        value = options.get(key, str(default))
        ok = value.isdigit() and int(value) >= least
        check(ok, f"{owner} {spec!r} {key}", value, f"an integer >= {least}")
        return int(value)

    return TextSpec(
        source,
        options["field"],
        options.get("split") or "train",
        number("rows", DEFAULT_ROWS, 1),
        number("seed", 0, 0),
        options.get("config") or None,
    )


@dataclass(frozen=True, eq=False)
class TextSet:
    """A loaded text spec: the split's texts in a seeded order (source row index, text)."""

    spec: TextSpec
    ordered: tuple[tuple[int, str], ...]

    def select(self, n: int | None = None, exclude: frozenset[int] | set[int] = frozenset()) -> list[str]:
        """The texts of the first `n` (default: the spec's `rows`) rows not in `exclude`."""
        n = self.spec.rows if n is None else n
        return [text for index, text in self.ordered if index not in exclude][:n]


def _load(spec: TextSpec):
    if spec.config is None or spec.source.lower().endswith(tuple(FILE_BUILDERS)):
        return load_rows(spec.source, spec.split)
    from datasets import load_dataset  # a hub dataset with several configurations

    return load_dataset(spec.source, spec.config, split=spec.split)


@functools.lru_cache(maxsize=16)
def load_text_set(spec: str, owner: str = "text spec") -> TextSet:
    """Load a text spec's split once per process; a missing field is named with the fields that
    exist, and a split without any non-blank text is refused."""
    parsed = parse_text_spec(spec, owner)
    data = _load(parsed)
    columns = list(data.column_names)
    check(
        parsed.field in columns,
        f"{owner} {spec!r} field",
        parsed.field,
        f"a field of the dataset, one of {columns}",
    )
    order = list(range(len(data)))
    random.Random(f"text-rows/{parsed.seed}").shuffle(order)
    column = data[parsed.field]
    ordered = tuple(
        (i, str(column[i]).strip()) for i in order if column[i] is not None and str(column[i]).strip()
    )
    check(
        bool(ordered),
        f"{owner} {spec!r}",
        f"{len(data)} rows",
        f"a split with non-blank texts in {parsed.field!r}",
    )
    return TextSet(parsed, ordered)
