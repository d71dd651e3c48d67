"""QA tasks from `datasets` specs: the SciQ and MedReason presets on fixture files, custom mappings,
mapping errors, disjoint held-out parts, and a rollout batch through `RolloutDataModule`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from distill.tasks import qa, qa_datasets
from distill.tasks.registry import get_task, is_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
SCIQ = f"sciq:{FIXTURES / 'sciq.jsonl'}?val=3&test=4"
MEDREASON = f"medreason:{FIXTURES / 'medreason.jsonl'}?val=2&test=2"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sciq_fixture_loads_into_rows_that_score():
    task = get_task(SCIQ)
    assert task is get_task(SCIQ)  # loaded once per process
    assert task.chance == pytest.approx(0.25) and task.skipped == 0
    rows = task.rows(13, seed=0, part="train")
    assert len(rows) == 13
    by_question = {r["question"]: r for r in _records(FIXTURES / "sciq.jsonl")}
    for row in rows:
        source = by_question[row["question"]]
        assert sorted(row["options"]) == sorted(
            [source["correct_answer"], source["distractor1"], source["distractor2"], source["distractor3"]]
        )
        assert row["options"][qa.LETTERS.index(row["answer"])] == source["correct_answer"]
        assert row["prompt"].startswith(row["question"]) and "A. " in row["prompt"]
        assert row["messages"][0]["role"] == "user" and row["question"] in row["messages"][0]["content"]
        assert source["support"] in row["reference"]
        assert task.score(row["reference"], row) == 1.0
        assert task.score(f"The answer is ({row['answer']})", row) == 1.0
        assert task.score(f"<answer>{source['correct_answer'].upper()}</answer>", row) == 1.0
        wrong = next(letter for letter in "ABCD" if letter != row["answer"])
        assert task.score(f"<answer>{wrong}</answer>", row) == 0.0
        assert task.score(f"<answer>{source['distractor1']}</answer>", row) == 0.0
        assert task.answer(f"<answer>{source['correct_answer']}</answer>", row) == row["answer"]
    assert task.answer("<answer> Heart </answer>") == "heart"  # without a row: as written
    # the correct option does not always sit at one letter
    assert len({r["answer"] for r in rows}) > 1


def test_medreason_fixture_parses_option_strings_and_open_questions():
    task = get_task(MEDREASON)
    assert task.skipped == 1  # "Tibia" names none of its options
    assert task.dropped == 2  # the preset leaves out free-text rows (free_form=drop)
    rows = [r for part in ("train", "val", "test") for r in task.rows(30, 0, part)]
    assert len(rows) == 21 and all(r["options"] for r in rows)
    source = {r["question"]: r for r in _records(FIXTURES / "medreason.jsonl")}
    assert {len(r["options"]) for r in rows} == {3, 4, 5}
    for row in rows:
        if row["source_index"] < 10:  # these rows write the option's text (the others: see test_qa_formats)
            assert row["answer_text"] == source[row["question"]]["answer"]
        assert row["options"][qa.LETTERS.index(row["answer"])] == row["answer_text"]
        assert task.score(row["reference"], row) == 1.0
        assert task.score(f"Reasoning... Answer: {row['answer_text'].lower()}", row) == 1.0
        assert task.score("<answer>Z</answer>", row) == 0.0
    assert task.chance == pytest.approx((18 / 4 + 2 / 5 + 1 / 3) / 21)
    kept = get_task(MEDREASON + "&free_form=exact")  # open questions, scored by exact match
    rows = [r for part in ("train", "val", "test") for r in kept.rows(30, 0, part)]
    open_row = next(r for r in rows if r["answer"] == "Skin")
    assert len(rows) == 23 and not open_row["options"] and "letter" not in open_row["prompt"]
    assert kept.score("<answer>skin</answer>", open_row) == 1.0
    assert kept.score("<answer>liver</answer>", open_row) == 0.0


def test_held_out_parts_are_fixed_and_disjoint_from_training():
    task = get_task(SCIQ)
    train = {r["question"] for r in task.rows(100, seed=0, part="train")}
    val = [r["question"] for r in task.rows(100, seed=0, part="val")]
    test = [r["question"] for r in task.rows(100, seed=0, part="test")]
    assert (len(train), len(val), len(test)) == (13, 3, 4)
    assert not train & set(val) and not train & set(test) and not set(val) & set(test)
    assert len(train | set(val) | set(test)) == 20
    # evaluation parts do not depend on the rows seed; the training order does
    assert [r["question"] for r in task.rows(3, seed=5, part="val")] == val
    orders = {tuple(r["question"] for r in task.rows(13, seed=s, part="train")) for s in range(5)}
    assert len(orders) > 1
    assert task.rows(2, seed=0) == task.rows(2, seed=9, part="val")  # default part: val
    # the spec's seed chooses other held-out questions (and another shuffle)
    other = get_task(SCIQ + "&seed=1")
    assert [r["question"] for r in other.rows(4, 0, "test")] != test


def test_custom_mappings_from_csv_parquet_and_json(tmp_path):
    from datasets import Dataset

    records = [
        {
            "stem": f"Q{i}: pick {i % 3}",
            "choices": ["zero", "one", "two"],
            "key": i % 3,
            "why": f"because {i}",
        }
        for i in range(12)
    ]
    json_path = tmp_path / "exam.json"
    json_path.write_text(json.dumps(records))
    task = get_task(f"qa:{json_path}?question=stem&options=choices&answer=key&reasoning=why&val=2&test=2")
    rows = task.rows(8, 0, "train")
    assert len(rows) == 8 and task.chance == pytest.approx(1 / 3)
    for row in rows:
        index = int(row["question"].split("pick ")[1])
        assert row["answer_text"] == ["zero", "one", "two"][index]
        assert task.score(f"<answer>{row['answer_text']}</answer>", row) == 1.0

    flat = [{"q": f"Is {i} even?", "right": "yes" if i % 2 == 0 else "no", "bad": "maybe"} for i in range(10)]
    flat.append({"q": "No key?", "right": "", "bad": "maybe"})  # an empty correct answer: skipped
    Dataset.from_list(flat).to_csv(tmp_path / "flat.csv", index=False)
    Dataset.from_list(flat).to_parquet(tmp_path / "flat.parquet")
    for name in ("flat.csv", "flat.parquet"):  # 1 of 11 unscorable: over the default 5 % share
        spec = f"qa:{tmp_path / name}?question=q&correct=right&distractors=bad&test=2&val=1"
        task = get_task(spec + "&max_skipped_share=0.1")
        assert task.chance == pytest.approx(0.5) and task.skipped == 1
        for row in task.rows(10, 0, "train"):
            assert task.score(f"<answer>{row['answer_text']}</answer>", row) == 1.0

    free = [{"question": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(10)]
    (tmp_path / "free.jsonl").write_text("".join(json.dumps(r) + "\n" for r in free))
    task = get_task(f"qa:{tmp_path / 'free.jsonl'}?question=question&answer=answer&test=1&val=1")
    assert task.chance == 0.0
    row = task.rows(1, 0, "test")[0]
    assert task.score(f"The answer is {row['answer']}.", row) == 1.0


def test_a_bad_mapping_names_the_missing_field_and_the_fields_that_exist():
    path = FIXTURES / "sciq.jsonl"
    with pytest.raises(
        ValueError,
        match=r"question must be a field of the dataset, one of \['question', .*'support'\], got 'stem'",
    ):
        get_task(f"qa:{path}?question=stem&correct=correct_answer&distractors=distractor1")
    with pytest.raises(ValueError, match=r"distractors must be a field of the dataset, .*got 'distractor9'"):
        get_task(f"sciq:{path}?distractors=distractor1,distractor9")
    with pytest.raises(ValueError, match=r"options must be a field of the dataset, one of .*got 'options'"):
        get_task(f"medreason:{path}")  # a SciQ file read with the MedReason mapping


@pytest.mark.parametrize(
    "spec, message",
    [
        ("sciq:{sciq}?colour=red", r"key must be one of \['split', 'question'"),
        ("sciq:{sciq}?val=many", r"val must be an integer >= 0, got 'many'"),
        ("sciq:{sciq}?val=10&test=10", r"val\+test must be < the 20 usable rows, got 20"),
        ("qa:{sciq}?answer=correct_answer", r"question must be a field name"),
        ("qa:{sciq}?question=question", r"answer must be a field name"),
        ("qa:{sciq}?question=question&correct=correct_answer", r"distractors must be field names"),
        ("qa:", r"source must be a hub id or a local file"),
        ("sciq:/no/such/file.jsonl", r"source must be an existing local file, got '/no/such/file.jsonl'"),
        ("trivia:x.jsonl", r"task must be one of .* or a dataset spec"),
    ],
)
def test_bad_specs_are_named(spec, message):
    with pytest.raises(ValueError, match=message):
        get_task(spec.format(sciq=FIXTURES / "sciq.jsonl"))


def test_specs_are_accepted_wherever_task_names_are():
    from distill.callbacks import TaskEvaluation
    from distill.callbacks.options import check_tasks

    assert is_task("countdown3") and is_task(SCIQ) and is_task("medreason:")
    assert not is_task("nope") and not is_task("trivia:x") and not is_task(None)
    name = get_task(SCIQ).name  # what metric keys use: no "/" of the file path
    assert name.startswith("sciq-sciq-") and "/" not in name and ":" not in name
    assert get_task(name) is get_task(SCIQ) and is_task(name)
    assert get_task(SCIQ + "&seed=1").name != name
    assert check_tasks("TaskEvaluation", "tasks", [SCIQ, "countdown3"]) == [name, "countdown3"]
    assert TaskEvaluation(tasks=[SCIQ]).tasks == [name]
    assert qa_datasets.parse_spec("sciq:").source == "allenai/sciq"
    assert qa_datasets.parse_spec("medreason:?split=train").source == "UCSC-VLAA/MedReason"


def test_the_datamodule_rolls_out_a_qa_task(char_tok, tiny_student, tiny_teacher):
    from distill.data import RolloutDataModule

    data = RolloutDataModule(
        task=SCIQ, evaluation={"test_tasks": [MEDREASON], "val_size": 10, "test_size": 10, "batch_size": 4, "max_new_tokens": 6}, sampling={"max_new_tokens": 6}, batch_size=2, train_size=50, mix=0.5,
    )  # fmt: skip
    data.tokenizer = char_tok
    data.setup("fit")
    data.setup("test")
    task = get_task(SCIQ)
    held_out = {r["question"] for r in data.val_sets[0]} | {r["question"] for r in task.rows(4, 0, "test")}
    assert len(data.train_set) == 13 and len(data.val_sets[0]) == 3 and len(data.test_sets[0]) == 2
    assert not held_out & set(data.train_set["question"])
    module = SimpleNamespace(student=tiny_student, teacher=tiny_teacher, tokenizer=char_tok)
    data.trainer = SimpleNamespace(
        training=True, testing=False, global_step=0, current_epoch=0, lightning_module=module
    )
    out = data.on_after_batch_transfer(next(iter(data.train_dataloader())), 0)
    assert out["task"] == task.name and len(out["rows"]) == 2 and out["rollout"].batch_size == 2
    texts = out["rollout"].completions(char_tok)
    assert all(get_task(out["task"]).score(t, r) in (0.0, 1.0) for t, r in zip(texts, out["rows"]))
    data.trainer.training = False
    out = data.on_after_batch_transfer(next(iter(data.val_dataloader()[0])), 0)
    assert out["task"] == task.name and out["rollout"].batch_size == 3


@pytest.mark.slow  # builds the quick tiny world once per session (shared with tests/test_cli.py)
def test_distill_fit_runs_on_sciq_and_medreason_files(tiny_world_cache, tmp_path, monkeypatch):
    """A tiny `distill fit` end to end: trains on a SciQ-schema file, tests on it and on a
    MedReason-schema file (tiny-world models, a few steps)."""
    from distill.lightning_cli import run_lightning_cli

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    sciq, medreason = get_task(SCIQ), get_task(MEDREASON)
    short = {
        "trainer.max_steps": "2",
        "trainer.val_check_interval": "1",
        "data.batch_size": "4",
        "data.evaluation.val_size": "8",
        "data.evaluation.test_size": "8",
        "data.evaluation.batch_size": "8",
        "data.sampling.max_new_tokens": "8",
        "data.evaluation.max_new_tokens": "8",
        "data.train_size": "13",
        "data.task": SCIQ,
        "data.evaluation.test_tasks": json.dumps([SCIQ, MEDREASON]),
        "run_dir": str(tmp_path / "run"),
    }
    args = [a for key, value in short.items() for a in (f"--{key}", value)]
    metrics = run_lightning_cli(["fit", "--config", "configs/tiny/base.yaml", *args])
    for key in (
        f"val/{sciq.name}/accuracy",
        f"test/{sciq.name}/accuracy",
        f"test/{medreason.name}/accuracy",
        f"test/{medreason.name}/pass@8",
    ):
        assert 0.0 <= metrics[key] <= 1.0, key
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert summary["status"] == "finished"
