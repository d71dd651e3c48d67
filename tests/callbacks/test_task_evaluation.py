"""TaskEvaluation: coverage aggregation on hand-made samples, entropy, and one real evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from distill.callbacks import TaskEvaluation
from distill.metrics import coverage_metrics, masked_sum_count, token_entropy
from distill.rollout import RolloutSampler
from distill.tasks.registry import get_task


def test_coverage_metrics_on_hand_made_samples():
    # Problem 1: 2 of 4 correct with two distinct answers (one up to whitespace); problem 2: none.
    correct = [[True, False, True, True], [False, False, False, False]]
    answers = [["1+2", None, "2+1", "1 + 2"], ["x", None, "y", "z"]]
    out = coverage_metrics(correct, answers, ks=(1, 2, 4))
    # pass@1 = c/n; pass@2 = 1 - C(1,2)/C(4,2) = 1 (only one wrong sample); pass@4 = 1.
    assert out["pass@1"] == pytest.approx((3 / 4 + 0) / 2)
    assert out["pass@2"] == pytest.approx((1.0 + 0) / 2)
    assert out["pass@4"] == pytest.approx((1.0 + 0) / 2)
    assert out["distinct_correct"] == pytest.approx((2 + 0) / 2)


def test_coverage_metrics_pass_at_k_matches_closed_form():
    correct = [[True] + [False] * 7, [True, True, True] + [False] * 5]
    out = coverage_metrics(correct, [[None] * 8] * 2, ks=(1, 4))
    closed = [1 - math.comb(8 - c, 4) / math.comb(8, 4) for c in (1, 3)]
    assert out["pass@4"] == pytest.approx(sum(closed) / 2)
    assert out["distinct_correct"] == 0.0  # no answer extracted


def test_coverage_metrics_rejects_bad_input():
    with pytest.raises(ValueError, match=r"ks must be integers in \[1, n=2\]"):
        coverage_metrics([[True, False]], [["a", "b"]], ks=(3,))
    with pytest.raises(ValueError, match="problem 1 has 1 flags"):
        coverage_metrics([[True, False], [True]], [["a", "b"], ["a"]], ks=(1,))


def test_token_entropy_matches_definition():
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    p = logits.softmax(-1)
    assert torch.allclose(token_entropy(logits).double(), -(p * p.log()).sum(-1), atol=1e-5)
    # A -inf logit (masked token) contributes nothing; a one-hot distribution has entropy 0.
    assert token_entropy(torch.tensor([0.0, -math.inf])).item() == pytest.approx(0.0)
    s, c = masked_sum_count(
        torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[True, False], [True, True]])
    )
    assert (s, c) == (8.0, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_samples": 4}, r"ks must be a non-empty list of integers in \[1, num_samples=4\]"),
        ({"temperature": 0.0}, "TaskEvaluation.temperature must be a finite number > 0, got 0.0"),
        ({"tasks": ["nope"]}, r"tasks must be task names from .* \(unknown: \['nope'\]\)"),
        ({"every_n_validations": 0}, "every_n_validations must be an integer >= 1, got 0"),
    ],
)
def test_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TaskEvaluation(**kwargs)


class FirstCharTask:
    """A stand-in verifier that random students pass sometimes: correct iff the completion starts
    with a character before 'P'; the answer is that character."""

    def score(self, completion: str, row: dict) -> float:
        return float(completion[:1] < "P" and completion[:1] != "")

    def answer(self, completion: str) -> str | None:
        return completion[:1] or None


def test_evaluate_scores_samples_and_entropy_independently(tiny_student, fake_trainer, fake_module, char_tok):
    """A real sampling pass with a random student: the aggregation equals a recomputation from
    the same seeded samples, and the entropy equals one computed from the logits directly."""
    cb = TaskEvaluation(tasks=["addition"], num_problems=3, num_samples=4, ks=(1, 2, 4), seed=5)
    module, trainer = fake_module(tiny_student), fake_trainer()
    task, rows = FirstCharTask(), get_task("addition").rows(3, seed=0)
    sampler = RolloutSampler(mix=0.0, max_new_tokens=6, temperature=1.0, vocab_size=len(char_tok))
    values = cb.evaluate(trainer, module, task, rows, sampler, batch_size=5)

    enc = char_tok([r["prompt"] for r in rows for _ in range(4)], return_tensors="pt", padding=True)
    again = [
        sampler.sample(
            tiny_student, tiny_student, enc["input_ids"][i : i + 4], enc["attention_mask"][i : i + 4], seed=5
        )
        for i in (0, 4, 8)  # batch_size 5 holds one whole problem of 4 samples per call
    ]
    texts = [t for r in again for t in r.completions(char_tok)]
    correct = [[task.score(texts[4 * p + j], rows[p]) > 0 for j in range(4)] for p in range(3)]
    answers = [[task.answer(texts[4 * p + j]) for j in range(4)] for p in range(3)]
    assert {k: values[k] for k in ("pass@1", "pass@2", "pass@4", "distinct_correct")} == pytest.approx(
        coverage_metrics(correct, answers, (1, 2, 4))
    )
    assert 0 < values["pass@1"] < values["pass@4"] <= 1  # the check above is not vacuous
    total = count = 0.0
    for r in again:
        pos = (r.attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = tiny_student(
                input_ids=r.input_ids, attention_mask=r.attention_mask, position_ids=pos
            ).logits
        p = logits[:, :-1, : len(char_tok)].double().softmax(-1)
        h = -(p * p.clamp_min(1e-300).log()).sum(-1)
        m = r.completion_mask[:, 1:]
        total, count = total + float(h[m].sum()), count + int(m.sum())
    assert values["sample_entropy"] == pytest.approx(total / count, rel=1e-4)
    assert 0 < values["sample_entropy"] <= math.log(len(char_tok))
