"""Text specs (`text:<source>?field=…`): seeded fixed rows, blank texts skipped, exclusion of
training rows, and errors that name the field and what exists."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from distill.tasks.text_datasets import is_text_spec, load_text_set, parse_text_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PASSAGES = FIXTURES / "text" / "passages.csv"
SCIQ = FIXTURES / "qa" / "sciq.jsonl"


def csv_texts() -> dict[int, str]:
    with PASSAGES.open() as f:
        return {i: row["text"] for i, row in enumerate(csv.DictReader(f))}


def test_rows_are_a_seeded_permutation_of_the_non_blank_texts():
    by_index = csv_texts()
    text_set = load_text_set(f"text:{PASSAGES}?field=text&rows=4&seed=3")
    # Independently: shuffle the row indices with the documented seed, drop the blank row.
    order = list(range(len(by_index)))
    random.Random("text-rows/3").shuffle(order)
    expected = [by_index[i] for i in order if by_index[i].strip()]
    assert text_set.select() == expected[:4]
    assert "" not in text_set.select(100) and len(text_set.select(100)) == 9
    other = load_text_set(f"text:{PASSAGES}?field=text&rows=4&seed=4").select()
    assert other != text_set.select() and set(other) <= set(expected)


def test_select_leaves_out_excluded_rows_and_keeps_the_count():
    text_set = load_text_set(f"text:{SCIQ}?field=support&split=validation&rows=5")
    first = [index for index, _ in text_set.ordered[:5]]
    kept = text_set.select(exclude=set(first[:2]))
    assert len(kept) == 5
    assert kept[:3] == text_set.select()[2:5]
    assert not {text for index, text in text_set.ordered if index in first[:2]} & set(kept)


def test_spec_parsing_defaults_and_keys():
    spec = parse_text_spec("text:wikitext?field=text&config=wikitext-103-raw-v1&split=test")
    assert (spec.source, spec.field, spec.split, spec.rows, spec.seed, spec.config) == (
        "wikitext",
        "text",
        "test",
        200,
        0,
        "wikitext-103-raw-v1",
    )
    assert is_text_spec("text:x?field=y") and not is_text_spec("sciq:x") and not is_text_spec(3)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "text:{sciq}?field=body",
            r"field must be a field of the dataset, one of \[.*'support'.*\], got 'body'",
        ),
        ("text:{sciq}", r"field must be the name of the text column"),
        ("text:{sciq}?field=support&rows=0", r"rows must be an integer >= 1, got '0'"),
        ("text:{sciq}?field=support&colour=red", r"key must be one of .*'field'.*got 'colour'"),
        ("text:?field=support", r"source must be a hub id or a local file"),
        ("text:/no/such.jsonl?field=support", r"source must be an existing local file"),
        ("text:{passages}?field=topic&rows=2", None),  # a valid spec: no error
    ],
)
def test_bad_specs_fail_with_the_field_named(spec, message):
    spec = spec.format(sciq=SCIQ, passages=PASSAGES)
    if message is None:
        assert len(load_text_set(spec, "Forgetting.nll_texts['x']").select()) == 2
        return
    with pytest.raises(ValueError, match=message):
        load_text_set(spec, "Forgetting.nll_texts['x']")
