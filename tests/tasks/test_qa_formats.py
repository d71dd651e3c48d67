"""answers as instruct models and MedReason's rows write them, and rows that
cannot be scored counted, logged, and capped.

The MedReason fixture's rows follow the dataset card's schema and the formats its rows use: an
option's text, that text then ". Explanation: …" (MedMCQA rows), a letter ("B", "C) text",
"The answer is D."), "A.: x" option lines, a PubMedQA decision, and free-text rows without options."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from distill.tasks import qa, qa_datasets
from distill.tasks.registry import get_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
MEDREASON = f"medreason:{FIXTURES / 'medreason.jsonl'}?val=2&test=2"
SCIQ = f"sciq:{FIXTURES / 'sciq.jsonl'}?val=3&test=4"
DRUGS = ["aspirin", "ibuprofen", "paracetamol", "naproxen"]
FAST = 1.0  # seconds for megabyte inputs: catches quadratic behaviour, not a benchmark


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("The correct option is B) ibuprofen.", "B"),
        ("Therefore, the correct option is **B. ibuprofen**.", "B"),
        ("The best option is (C).", "C"),
        ("The correct choice is C.", "C"),
        ("Correct option: D", "D"),
        ("The right answer would be B.", "B"),
        ("**Answer**: B", "B"),
        ("the correct option is ibuprofen.", "B"),
        ("Option B is correct.", "B"),
        ("Option A is wrong. Option C is correct.", "C"),
        ("So (D) is the correct answer.", "D"),
        ("B is the best option here.", "B"),
        ("I would choose option B.", "B"),
        ("I choose (C).", "C"),
        # the last statement wins, whichever its form
        ("Option C is correct. Hmm, no: the answer is D", "D"),
        ("The answer is A... on reflection, the correct option is C) paracetamol.", "C"),
        # words that only look like a choice
        ("Let me choose a drug: something mild.", None),
        ("The correct option is unclear.", None),
        ("Option E is correct.", None),  # out of range for four options
        ("The answer is correct.", None),
        ("I hope this answers your question: C", None),
    ],
)
def test_instruct_phrasings_name_the_option(completion, expected):
    assert qa.extract(completion, DRUGS) == expected
    if expected is not None:
        assert qa.score(completion, DRUGS, expected) == 1.0


def test_free_form_reads_the_same_phrases():
    assert qa.extract("The correct response is Paris. It is the capital.") == "paris"
    assert qa.extract("Option B is correct.") is None  # a letter names nothing without options


HOSTILE = [
    "The correct option is " * 100_000,
    "Option A is correct. " * 100_000,
    "B is the correct answer " * 100_000,
    "choose " * 200_000,
    "choose (" * 200_000,
    "correct " * 200_000,
    "correct" + " \t" * 500_000 + "option is",
    "option" + " " * 1_000_000 + "A is correct",
    "A " * 500_000 + "is the correct answer",
    "best option is " + "B" * 1_000_000,
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_new_phrases_stay_fast_and_never_raise_on_hostile_text(text):
    for options in (DRUGS, []):
        start = time.perf_counter()
        found = qa.extract(text, options)
        assert time.perf_counter() - start < FAST
        assert found is None or isinstance(found, str)


def test_a_phrase_answer_is_read_near_the_end_of_the_text():
    # the answer states itself at the end; the noise before it, however long, costs nothing
    assert qa.extract("x " * 1_000_000 + "The correct option is B) ibuprofen.", DRUGS) == "B"


URO = ["Deep transverse perineus", "Perineal membrane", "Colles fascia", "Sphincter urethrae"]


@pytest.mark.parametrize(
    "answer, options, expected",
    [
        ("Colles fascia. Explanation: Colles fascia lies superficial to it.", URO, 2),
        ("Perineal membrane.. Explanation: the membrane is part of it.", URO, 1),
        ("C. Explanation: it is superficial.", URO, 2),
        ("C) Colles fascia", URO, 2),
        ("The answer is C.", URO, 2),
        ("colles  FASCIA", URO, 2),
        ("(c)", URO, 2),
        ("None of these. Explanation: x", URO, None),
        ("Fascia lata", URO, None),
        # an option written like a letter and text is the option, not the letter
        ("E. coli. Explanation: it causes most UTIs.", ["Proteus", "Klebsiella", "E. coli", "Enterococcus", "S. aureus"], 2),
        ("The final decision is: yes. Cohort data agree.", ["yes", "no", "maybe"], 0),
        # a lone letter stays a letter even where an option reads like one
        ("A", ["O", "A", "B", "AB"], 0),
        ("AB", ["O", "A", "B", "AB"], 3),
        (2, URO, 2),
        (7, URO, None),
        (True, URO, None),
    ],
)  # fmt: skip
def test_gold_answers_as_medreason_writes_them(answer, options, expected):
    assert qa_datasets.gold_index(answer, options) == expected


def test_option_lines_written_with_a_dot_and_a_colon():
    assert qa_datasets.parse_options("Answer Choices:\nA.: 9\nB.: 11\nC.: 13") == ["9", "11", "13"]


# What each fixture row's answer names (rows 0-9 write the option's text itself).
GOLD = {
    12: "Colles fascia",
    13: "Ethosuximide",
    14: "Vitamin K",
    15: "All of the above",
    16: "E. coli",
    17: "IgG",
    18: "Abducens",
    19: "Galactose-1-phosphate uridyltransferase",
    20: "13",
    21: "yes",
    22: "Loss of deep tendon reflexes",
}


def test_every_medreason_row_format_resolves_to_its_option():
    records = [json.loads(line) for line in (FIXTURES / "medreason.jsonl").read_text().splitlines()]
    task = get_task(MEDREASON)
    rows = [r for part in ("train", "val", "test") for r in task.rows(50, 0, part)]
    assert len(rows) == 21 and all(r["options"] for r in rows)
    assert {r["source_index"] for r in rows} == set(range(23)) - {10, 11}  # open "Skin", "Tibia"
    for row in rows:
        gold = GOLD.get(row["source_index"], records[row["source_index"]]["answer"])
        assert row["answer_text"] == gold
        assert row["options"][qa.LETTERS.index(row["answer"])] == gold
        assert task.score(row["reference"], row) == 1.0
        assert task.score(f"The correct option is {row['answer']}) {gold}.", row) == 1.0
    # one row names no option; two free-text rows are dropped on purpose, not skipped
    assert (task.skipped, task.skip_reasons, task.dropped) == (1, {"answer names no option": 1}, 2)
    assert task.skipped_share == pytest.approx(1 / 22)


def test_free_form_rows_are_kept_when_asked():
    task = get_task(MEDREASON + "&free_form=exact")
    assert (len(task.items), task.skipped, task.dropped) == (23, 1, 0)
    (skin,) = [i for i in task.items if i.answer_text == "Skin"]
    row = task._row(skin)
    assert (
        task.score("<answer>skin</answer>", row) == 1.0 and task.score("<answer>liver</answer>", row) == 0.0
    )


def _exam(tmp_path: Path, n: int, broken: int) -> Path:
    """`n` rows, the first `broken` of them with an answer naming no option."""
    rows = [
        {"q": f"Pick {i % 3}?", "opts": "A. zero\nB. one\nC. two", "key": "seven" if i < broken else ["A", "B", "C"][i % 3]}
        for i in range(n)
    ]  # fmt: skip
    path = tmp_path / f"exam{n}_{broken}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_split_with_too_many_unscorable_rows_refuses_to_load(tmp_path):
    spec = f"qa:{_exam(tmp_path, 20, 4)}?question=q&options=opts&answer=key&val=2&test=2"
    message = (
        rf"^data\.task '{re.escape(spec)}': 4 of 20 rows of split 'train' \(20\.0%\) cannot be scored "
        r"\(answer names no option: 4\), more than max_skipped_share=0\.05 allows; .*max_skipped_share"
    )
    with pytest.raises(ValueError, match=message) as refused:
        qa_datasets.build(spec)
    assert "\n" not in str(refused.value)
    task = qa_datasets.build(spec + "&max_skipped_share=0.2")  # at the maximum: loads
    assert (task.skipped, len(task.items), task.skipped_share) == (4, 16, 0.2)
    assert qa_datasets.build(f"qa:{_exam(tmp_path, 20, 1)}?question=q&options=opts&answer=key").skipped == 1


@pytest.mark.parametrize(
    "query, message",
    [
        ("free_form=maybe", r"free_form must be one of \['exact', 'drop'\], got 'maybe'"),
        ("max_skipped_share=2", r"max_skipped_share must be a number in \[0, 1\], got '2'"),
        ("max_skipped_share=lots", r"max_skipped_share must be a number in \[0, 1\], got 'lots'"),
        ("max_skipped_share=nan", r"max_skipped_share must be a number in \[0, 1\], got 'nan'"),
    ],
)
def test_bad_settings_are_named(query, message):
    with pytest.raises(ValueError, match=message):
        qa_datasets.parse_spec(f"{SCIQ}&{query}")


def test_a_run_logs_the_skipped_rows_of_its_qa_tasks_once(char_tok):
    from distill.data import RolloutDataModule

    class Recorder:
        def __init__(self):
            self.logged = []

        def log_metrics(self, metrics, step):
            self.logged.append((dict(metrics), step))

    data = RolloutDataModule(
        task=MEDREASON, evaluation={"test_tasks": [SCIQ, "countdown3"], "val_size": 2, "test_size": 2, "batch_size": 2, "max_new_tokens": 4}, sampling={"max_new_tokens": 4}, batch_size=2, train_size=8,
    )  # fmt: skip
    data.tokenizer, recorder = char_tok, Recorder()
    data.trainer = SimpleNamespace(loggers=[recorder])
    data.setup("fit")
    data.setup("test")
    medreason, sciq = get_task(MEDREASON).name, get_task(SCIQ).name
    assert recorder.logged == [
        (
            {
                f"data/{medreason}/skipped_rows": 1.0,
                f"data/{medreason}/skipped_share": pytest.approx(1 / 22),
                f"data/{medreason}/dropped_rows": 2.0,
                f"data/{sciq}/skipped_rows": 0.0,
                f"data/{sciq}/skipped_share": 0.0,
                f"data/{sciq}/dropped_rows": 0.0,
            },
            0,
        )
    ]
