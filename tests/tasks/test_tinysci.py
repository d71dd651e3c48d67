"""The tiny world's knowledge domain: the world, its question pools and their scoring."""

import random
import re
from collections import Counter

import pytest

from distill.tasks import qa, tinysci
from distill.tasks.registry import get_task, is_task

W = tinysci.WORLD
_SENTENCE = re.compile(r"(\w+) (is|lives in|eats) (\w+)\.")
_RELATION = {"is": "color", "lives in": "home", "eats": "eats"}


def test_the_world_is_fixed_by_its_seed_and_well_formed():
    again = tinysci.make_world(0)
    assert again.names == W.names and again.color == W.color and again.eats == W.eats
    assert again.compose == W.compose
    assert tinysci.make_world(1).names != W.names
    assert len(set(W.names)) == len(W.names) == tinysci.N_ENTITIES
    assert all(re.fullmatch(r"[a-z]{5}", x) for x in W.names)
    assert not set(W.names) & (set(tinysci.COLORS) | set(tinysci.HOMES))
    assert all(W.eats[x] != x and W.eats[x] in W.names for x in W.names)
    assert len(W.compose) == round(tinysci.COMPOSE_SHARE * len(W.names))
    with pytest.raises(ValueError, match="at least 5 creatures, got 3"):
        tinysci.make_world(0, n=3)


def test_questions_have_one_right_option_among_distinct_ones_of_its_kind():
    for q in tinysci.generate(600, seed=3):
        assert len(q.options) == len(set(q.options)) == tinysci.N_OPTIONS
        relation, last = q.steps[-1]
        assert q.options[q.answer_index] == W.fact(relation, last)
        values = {"color": tinysci.COLORS, "home": tinysci.HOMES, "eats": W.names}[relation]
        assert set(q.options) <= set(values)
        assert last not in q.options  # "what does x eat?" never offers x itself


def test_the_right_letter_is_spread_evenly():
    letters = Counter(q.answer_index for q in tinysci.generate(4000, seed=0))
    assert set(letters) == {0, 1, 2, 3}
    assert all(0.22 < c / 4000 < 0.28 for c in letters.values()), letters


def test_the_reference_reasons_with_the_true_facts_then_answers():
    task = get_task("tinysci")
    for row, q in zip(task.rows(300, seed=5), tinysci.generate(300, seed=5)):
        think = re.fullmatch(r"<think>(.*)</think><answer>(\w+)</answer>", row["reference"])
        assert think is not None, row["reference"]
        stated = _SENTENCE.findall(think.group(1))
        assert len(stated) == (1 if q.kind in tinysci.ONE_STEP else 2)
        for subject, verb, value in stated:  # independent of the module: read back the sentences
            assert {"color": W.color, "home": W.home, "eats": W.eats}[_RELATION[verb]][subject] == value
        assert stated[-1][2] == think.group(2) == row["answer_text"]
        assert row["options"]["ABCD".index(row["answer"])] == row["answer_text"]
        if len(stated) == 2:  # the chain: the second fact is about what the first creature eats
            assert stated[1][0] == stated[0][2] == W.eats[q.subject]
        assert task.score(row["reference"], row) == 1.0
        other = next(o for o in row["options"] if o != row["answer_text"])
        assert task.score(row["reference"].replace(f">{row['answer_text']}<", f">{other}<"), row) == 0.0
        assert task.score(f"<answer>{row['answer']}</answer>", row) == 1.0  # the letter counts too
        # a value of the question's own kind that is not among the options answers nothing
        values = {"color": tinysci.COLORS, "home": tinysci.HOMES, "eats": W.names}[q.steps[-1][0]]
        absent = next(v for v in values if v not in row["options"])
        assert task.score(f"<answer>{absent}</answer>", row) == 0.0


def test_fact_sheets_state_a_creatures_facts_and_the_corpus_mixes_them_with_questions():
    x = W.names[0]
    prompt, sheet = tinysci.about(W, x)
    assert prompt == f"About {x}:\n"
    assert set(_SENTENCE.findall(sheet)) == {
        (x, "is", W.color[x]),
        (x, "lives in", W.home[x]),
        (x, "eats", W.eats[x]),
    }
    assert tinysci.about(W, x, known=frozenset()) is None
    _, part = tinysci.about(W, x, known=frozenset({("home", x)}))
    assert part == f"{x} lives in {W.home[x]}."
    rows = tinysci.corpus(2000, seed=1)
    assert rows == tinysci.corpus(2000, seed=1) and rows != tinysci.corpus(2000, seed=2)
    sheets = sum(p.startswith("About ") for p, _ in rows)
    assert 0.45 < sheets / len(rows) < 0.55
    known = tinysci.student_facts()
    for _, text in tinysci.corpus(1000, seed=1, known=known):
        for subject, verb, _ in _SENTENCE.findall(text):
            assert (_RELATION[verb], subject) in known


def test_the_prompt_is_the_question_then_lettered_options():
    row = get_task("tinysci").rows(1, seed=0)[0]
    assert row["prompt"] == row["question"] + "\n" + qa.format_options(row["options"]) + "\n"
    assert row["messages"][0]["role"] == "user" and row["question"] in row["messages"][0]["content"]


def test_the_pools_are_disjoint_and_the_compose_one_is_never_trained_on():
    train = set(tinysci.candidates(W, "train"))
    compose = set(tinysci.candidates(W, "compose"))
    assert not train & compose
    assert {k for k, _ in compose} == set(tinysci.TWO_STEP)
    assert {x for _, x in compose} == set(W.compose)
    assert all(k in tinysci.ONE_STEP or x not in W.compose for k, x in train)
    # one-step questions about every creature: every fact is trained on
    assert {x for k, x in train if k in tinysci.ONE_STEP} == set(W.names)
    drawn = {(q.kind, q.subject) for q in tinysci.generate(2000, seed=0, pool="compose")}
    assert drawn <= compose
    with pytest.raises(ValueError, match="pool must be one of"):
        tinysci.generate(1, pool="test")


def test_the_student_pool_asks_only_about_the_students_facts():
    known = tinysci.student_facts()
    facts = len(W.names) * len(tinysci.RELATIONS)
    assert len(known) == round(tinysci.STUDENT_KNOWS * facts)
    assert tinysci.student_facts() == known  # seeded
    for q in tinysci.generate(500, seed=2, known=known):
        assert set(q.steps) <= known
    # without them the student's training misses most questions of the held-out pool
    assert len(tinysci.candidates(W, "compose", known)) < 0.2 * len(tinysci.candidates(W, "compose"))


def test_rows_are_seeded_and_the_tasks_are_registered():
    task = get_task("tinysci_compose")
    assert task.rows(20, seed=1) == task.rows(20, seed=1)
    assert task.rows(20, seed=1) != task.rows(20, seed=2)
    assert is_task("tinysci") and is_task("tinysci_compose")
    assert task.chance == 0.25
    row = task.rows(1, seed=0)[0]
    assert task.answer(f"<answer>{row['answer_text'].upper()}</answer>", row) == row["answer"]
    assert task.answer("no answer here", row) is None
    with pytest.raises(ValueError, match="kind must be one of"):
        tinysci.question(W, "weight", W.names[0], random.Random(0))


SHORT = [
    "--trainer.max_steps", "2",
    "--trainer.val_check_interval", "1",
    "--trainer.enable_progress_bar", "false",
    "--data.batch_size", "4",
    "--data.train_size", "32",
    "--data.evaluation.val_size", "8",
    "--data.evaluation.test_size", "8",
    "--data.evaluation.batch_size", "16",
    "--data.sampling.max_new_tokens", "12",
    "--data.evaluation.max_new_tokens", "12",
]  # fmt: skip


@pytest.mark.slow
def test_the_knowledge_and_countdown_configs_run_side_by_side_on_one_world(
    tiny_world_cache, tmp_path, monkeypatch
):
    import json
    from pathlib import Path

    import yaml

    from distill.lightning_cli import run_lightning_cli

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    sci = run_lightning_cli(
        ["fit", "--config", "configs/tiny/sci_base.yaml", *SHORT, "--run_dir", str(tmp_path / "sci")]
    )
    countdown = run_lightning_cli(
        ["fit", "--config", "configs/tiny/base.yaml", *SHORT, "--run_dir", str(tmp_path / "cd")]
    )
    for split, task in (("val", "tinysci"), ("test", "tinysci"), ("test", "tinysci_compose")):
        assert 0.0 <= sci[f"{split}/{task}/pass@1"] <= 1.0
    assert sci["test/tinysci/chance"] == pytest.approx(0.25)  # reported beside the accuracy
    assert "test/countdown3/chance" not in sci and "val/countdown3/chance" not in countdown
    assert "forgetting/countdown3/score" in sci  # the pair's other skill is a retention set
    assert not any(k.startswith("style/") for k in sci)  # base.yaml's callbacks replaced, not appended
    assert "val/countdown3/pass@1" in countdown and "style/teacher_style_share" in countdown
    config = yaml.safe_load((tmp_path / "sci" / "config.yaml").read_text())
    assert config["model"]["init_args"]["teacher"] == "tiny-world:teacher-sci"
    assert config["data"]["task"] == "tinysci"
    summary = json.loads((tmp_path / "sci" / "metrics.json").read_text())
    assert summary["status"] == "finished"
