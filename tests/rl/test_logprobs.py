"""GRPO's chunked log-probabilities against the direct formula, and GRPOModule's lean forward
passes against every position's logits (the objective, its statistics and its gradient)."""

from __future__ import annotations

import pytest
import torch

from distill.callbacks import GradientStats
from distill.losses import token_statistics
from distill.rl import GRPOModule, token_logprobs
from distill.rl.logprobs import token_logprobs_and_kl


def _direct(logits, tokens, temperature):
    return torch.log_softmax(logits / temperature, -1).gather(-1, tokens[..., None])[..., 0]


@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_values_and_gradient_equal_the_direct_formula(chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64) * 3
    tokens = torch.randint(0, 11, (3, 5), generator=g)
    weights = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mine = logits.clone().requires_grad_(True)
    logp, kl = token_logprobs_and_kl(mine, tokens, 0.7, chunk_size=chunk_size)
    (logp * weights).sum().backward()
    want = logits.clone().requires_grad_(True)
    direct = _direct(want, tokens, 0.7)
    (direct * weights).sum().backward()
    assert kl is None
    torch.testing.assert_close(logp, direct.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine.grad, want.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda z: token_logprobs_and_kl(z, tokens, 0.7, chunk_size=chunk_size)[0],
        (mine.detach().requires_grad_(True),),
    )


def test_a_strided_view_and_a_reference_in_one_pass():
    """The module hands a strided slice of the head's output (`[:, -(K+1):-1, :V]`): the result
    and its gradient match the direct formula, and the KL to a reference that of token_statistics."""
    g = torch.Generator().manual_seed(1)
    head = torch.randn(2, 7, 13, generator=g, dtype=torch.float64).requires_grad_(True)
    reference = torch.randn(2, 6, 11, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 11, (2, 6), generator=g)
    logits = head[:, :-1, :11]
    logp, kl = token_logprobs_and_kl(logits, tokens, 1.3, reference=reference, chunk_size=5)
    logp.sum().backward()
    grad = head.grad.clone()
    head.grad = None
    _direct(head[:, :-1, :11], tokens, 1.3).sum().backward()
    torch.testing.assert_close(grad, head.grad, rtol=1e-12, atol=1e-12)
    want = token_statistics(logits.detach(), reference, temperature=1.3)["reverse_kl"]
    torch.testing.assert_close(kl, want, rtol=1e-12, atol=1e-12)
    assert not kl.requires_grad


def test_low_precision_logits_get_a_gradient_of_their_own_dtype():
    logits = torch.randn(2, 3, 17, dtype=torch.bfloat16).requires_grad_(True)
    tokens = torch.randint(0, 17, (2, 3))
    logp = token_logprobs(logits, tokens)
    assert logp.dtype == torch.float32
    logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    want = logits.detach().float().requires_grad_(True)
    _direct(want, tokens, 1.0).sum().backward()
    torch.testing.assert_close(logits.grad.float(), want.grad, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            (torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)),
            r"logits \[B, T, V\] and tokens \[B, T\] disagree",
        ),
        (
            (torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), 0.0),
            "temperature must be a finite number > 0",
        ),
        (
            (torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), 1.0, torch.zeros(2, 3, 6)),
            "reference logits must have",
        ),
    ],
)
def test_bad_input_is_named(args, match):
    with pytest.raises(ValueError, match=match):
        token_logprobs_and_kl(*args)


def _move(model, seed: int, size: float) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(size * torch.randn_like(p))


def _run(rollouts, policy_dir, batch, lean: bool):
    module = GRPOModule(student=policy_dir, objective={"kl_coef": 0.2}, execution={"lean_logits": lean}, micro_batch_size=5)
    module.configure_model()
    module.student.double()
    module.reference.double()
    sink = GradientStats()
    sink.active, module.logit_grad_sink = True, sink
    step = module.prepare(batch)
    step.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 2.0, -2.0, 0.1, -0.1])
    _move(module.student, seed=5, size=0.1)  # a policy away from its reference: KL > 0
    first = module.accumulate_gradients(step, first=True)
    _move(module.student, seed=7, size=0.3)  # an off-policy second pass
    module.student.zero_grad()
    second = module.accumulate_gradients(step, first=False)
    grads = [p.grad.clone() for p in module.student.parameters()]
    return first, second, grads, step, sink.step_sq


def test_lean_grpo_passes_equal_the_full_logits_passes(rollouts, policy_dir):
    data = rollouts.data(policy_dir, group_size=4, sampling={"max_new_tokens": 10})
    sampling = GRPOModule(student=policy_dir)
    sampling.configure_model()
    batch = rollouts.batch(data, sampling)
    assert batch["rollout"].completion_mask[:, : batch["rollout"].prompt_length].sum() == 0
    lean = _run(rollouts, policy_dir, batch, lean=True)
    full = _run(rollouts, policy_dir, batch, lean=False)
    for key in ("loss", "clipped", "kl_to_start", "kl_penalty"):
        for a, b in zip(lean[:2], full[:2]):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
    assert full[0]["kl_to_start"] > 0 and full[0]["kl_penalty"] > 0 and full[1]["clipped"] > 0
    for a, b in zip(lean[2], full[2]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    mask = lean[3].mask.bool()  # log-prob buffers agree where they are read
    torch.testing.assert_close(lean[3].old_logp[mask], full[3].old_logp[mask])
    torch.testing.assert_close(lean[3].ref_logp[mask], full[3].ref_logp[mask])
    torch.testing.assert_close(lean[4], full[4], rtol=1e-6, atol=0)  # GradientStats (float32 squares)
