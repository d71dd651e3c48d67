"""DistillationModule with lean forward passes: the same loss, gradients, statistics and
GradientStats records as with every position's logits, fewer positions through the LM heads, and
evaluation chunked by a memory budget with the same figures."""

from __future__ import annotations

import pytest
import torch

from distill.callbacks import GradientStats
from distill.losses import ForwardKL, ReverseKL, token_statistics
from distill.losses.functional import STATISTICS
from distill.module import DistillationModule
from distill.rollout import RolloutBatch
from distill.training import completion_statistics


def direct_logits(model, ids, attn, vocab):
    """Every position's logits straight from the model (position t predicts token t + 1)."""
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, :-1, :vocab]


def _save(path, seed: int, hidden: int):
    from transformers import LlamaForCausalLM

    from distill.models.tiny import char_tokenizer, llama_config

    torch.manual_seed(seed)
    LlamaForCausalLM(
        llama_config(vocab_size=112, hidden_size=hidden, num_layers=1, num_heads=2)
    ).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return _save(root / "student", 1, 32), _save(root / "teacher", 2, 48)


def _module(pair, **options) -> DistillationModule:
    module = DistillationModule(student=pair[0], teacher=pair[1], **options)
    module.configure_model()
    module.student.double()  # float64: lean and full must agree to rounding
    module.teacher.double()
    return module


def _rollout(prompt_widths=(7, 4, 6, 2), lengths=(3, 9, 1, 5), seed=0) -> RolloutBatch:
    """Left-padded prompts of different widths, completions of different lengths (right-padded)."""
    g = torch.Generator().manual_seed(seed)
    width = max(prompt_widths)
    total = width + max(lengths)
    b = len(lengths)
    ids = torch.zeros(b, total, dtype=torch.long)
    attn = torch.zeros(b, total, dtype=torch.long)
    comp = torch.zeros(b, total, dtype=torch.bool)
    for i, (p, n) in enumerate(zip(prompt_widths, lengths)):
        ids[i, width - p : width + n] = torch.randint(8, 104, (p + n,), generator=g)
        attn[i, width - p : width + n] = 1
        comp[i, width : width + n] = True
    teacher = comp & (torch.rand(b, total, generator=g) < 0.5)
    return RolloutBatch(ids, attn, comp, teacher, width)


def _step(module, rollout):
    sink = GradientStats()
    sink.active, module.logit_grad_sink = True, sink
    positions = []
    module.student.lm_head.register_forward_hook(lambda m, inp, out: positions.append(inp[0].shape[1]))
    means, num_items, _ = module.accumulate_gradients(rollout)
    grads = [p.grad.clone() for p in module.student.parameters()]
    return means, num_items, grads, (sink.step_sq, sink.step_count), positions


@pytest.mark.parametrize(("divergence", "micro"), [(ForwardKL, None), (ReverseKL, 3)])
def test_lean_step_equals_the_full_logits_step(pair, divergence, micro):
    rollout = _rollout()
    lean = _step(_module(pair, divergence=divergence(), micro_batch_size=micro), rollout)
    full = _step(
        _module(pair, divergence=divergence(), micro_batch_size=micro, execution={"lean_logits": False}), rollout
    )
    torch.testing.assert_close(vars(lean[0]), vars(full[0]), rtol=1e-10, atol=1e-12)
    assert int(lean[1]) == int(full[1]) == 18
    for a, b in zip(lean[2], full[2]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    # GradientStats squares the gradient in float32: equal to its rounding.
    torch.testing.assert_close(lean[3][0], full[3][0], rtol=1e-6, atol=0)
    assert lean[3][1].tolist() == full[3][1].tolist() and full[3][1][0] == 18  # and token counts
    # All completions start at column 7: 9 columns (+1 for the dropped last position) go through
    # the LM head instead of 16, in every micro-batch.
    assert lean[4] == ([10] if micro is None else [10, 10]) and set(full[4]) == {16}


def _direct_statistics(module, rollout):
    """token_statistics on every position's logits from direct model calls, and the completion mask."""
    with torch.no_grad():
        student, teacher = (
            direct_logits(m, rollout.input_ids, rollout.attention_mask, 104)
            for m in (module.student, module.teacher)
        )
    return token_statistics(student, teacher), rollout.completion_mask[:, 1:].double()


def test_step_statistics_match_an_independent_full_computation(pair):
    """The logged means against token_statistics on every position's logits, masked by hand."""
    module, rollout = _module(pair), _rollout(seed=3)
    means, num_items, _ = module.accumulate_gradients(rollout)
    stats, mask = _direct_statistics(module, rollout)
    for key in STATISTICS:
        torch.testing.assert_close(
            getattr(means, key), ((stats[key] * mask).sum() / mask.sum()).float(), rtol=1e-6, atol=0
        )  # the step's sums are float32
    assert torch.allclose(means.loss, means.forward_kl, rtol=1e-6)


@pytest.mark.parametrize("budget_mb", [1e-6, 0.03, 512.0])
def test_evaluation_chunked_by_budget_gives_the_unchunked_figures(pair, budget_mb):
    module, rollout = _module(pair), _rollout(seed=4)
    stats, mask = _direct_statistics(module, rollout)
    calls = []
    module.teacher.lm_head.register_forward_hook(lambda m, inp, out: calls.append(tuple(inp[0].shape[:2])))
    for lean in (True, False):
        sums, count = completion_statistics(module.student, module.teacher, rollout, 104, budget_mb, lean)
        assert int(count) == 18
        for key in STATISTICS:
            torch.testing.assert_close(sums[key], (stats[key] * mask).sum(), rtol=1e-10, atol=1e-12)
    # 1e-6 MiB: one row per chunk; 0.03 MiB = 31457 bytes hold 2 rows of 9 x 104 float64 logits
    # of both models (14976 bytes a row); 512 MiB: the whole batch. The full pass reads 16 columns.
    rows = {1e-6: [1, 1, 1, 1], 0.03: [2, 2], 512.0: [4]}[budget_mb]
    assert [c[0] for c in calls[: len(rows)]] == rows and {c[1] for c in calls[: len(rows)]} == {10}
    assert {c[1] for c in calls[len(rows) :]} == {16}


def test_gradient_checkpointing_gives_the_same_step(pair):
    rollout = _rollout(seed=5)
    plain = _step(_module(pair), rollout)
    checkpointed_module = _module(pair, execution={"gradient_checkpointing": True})
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed_module.student.modules())
    checkpointed = _step(checkpointed_module, rollout)
    for a, b in zip(plain[2], checkpointed[2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"execution": {"eval_logit_budget_mb": 0}},
            "model.execution.eval_logit_budget_mb must be a finite number > 0, got 0",
        ),
        (
            {"execution": {"attn_implementation": "flash"}},
            r"model.execution.attn_implementation must be one of \[.*\], got 'flash'",
        ),
        ({"execution": {"compile": True}}, r"model.execution has no setting 'compile'; it has \["),
        ({"text_log": {"every": -1}}, "model.text_log.every must be an integer >= 0, got -1"),
    ],
)
def test_bad_options_name_the_field(pair, options, match):
    with pytest.raises(ValueError, match=match):
        DistillationModule(student=pair[0], teacher=pair[1], **options)
