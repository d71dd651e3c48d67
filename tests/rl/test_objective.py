"""GRPO's tensor math against hand computations: advantages, clipped surrogate, KL penalty."""

from __future__ import annotations

import statistics

import pytest
import torch

from distill.rl import clipped_surrogate, group_advantages, kl_penalty, token_logprobs


def test_advantages_match_a_hand_computation_per_group():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5]  # groups of 4: [1 0 0 1], [1 1 0 .5]
    adv, zero = group_advantages(torch.tensor(rewards), 4, scale=True, eps=1e-4)
    expected = []
    for g in (rewards[:4], rewards[4:]):
        mean, std = statistics.mean(g), statistics.stdev(g)  # sample std, as TRL
        expected += [(r - mean) / (std + 1e-4) for r in g]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    assert zero.tolist() == [False, False]
    assert adv.view(2, 4).sum(dim=1).abs().max() < 1e-6  # centred within each group


def test_all_equal_groups_get_exactly_zero_advantage_and_are_flagged():
    # 0.1 * 3 / 3 is not 0.1 in floating point: the zero must not come from the arithmetic.
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    adv, zero = group_advantages(rewards, 3)
    assert zero.tolist() == [True, True, True, False]
    assert torch.equal(adv[:9], torch.zeros(9))
    assert adv[9] > 0 > adv[10] and adv[10] == adv[11]


def test_dr_grpo_only_centres():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv, _ = group_advantages(rewards, 4, scale=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_of_one_carries_no_signal():
    adv, zero = group_advantages(torch.tensor([1.0, 0.0]), 1)
    assert torch.equal(adv, torch.zeros(2)) and zero.all()


@pytest.mark.parametrize(
    ("rewards", "group_size", "eps", "match"),
    [
        (torch.zeros(5), 2, 1e-4, "multiple of group_size=2"),
        (torch.zeros(4), 0, 1e-4, "group_size must be an integer >= 1"),
        (torch.zeros(2, 2), 2, 1e-4, r"rewards must be \[N\]"),
        (torch.zeros(4), 2, -1.0, "eps must be >= 0"),
    ],
)
def test_advantage_inputs_are_checked(rewards, group_size, eps, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, group_size, eps=eps)


def test_token_logprobs_equal_log_softmax_at_the_tokens():
    torch.manual_seed(0)
    logits, tokens = torch.randn(2, 3, 7), torch.randint(7, (2, 3))
    got = token_logprobs(logits, tokens, temperature=0.7)
    want = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(got, want)


def _surrogate_grad(log_ratio: float, advantage: float, low: float = 0.2, high: float = 0.3):
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, cut = clipped_surrogate(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([advantage]), low, high
    )
    loss.sum().backward()
    return float(loss.detach()), float(logp.grad), bool(cut)


@pytest.mark.parametrize(
    ("ratio", "advantage", "cut"),
    [
        (1.5, 2.0, True),  # above 1 + high with A > 0: moved far enough up
        (0.5, -2.0, True),  # below 1 - low with A < 0: moved far enough down
        (1.1, 2.0, False),  # inside the band
        (0.9, -2.0, False),
        (0.5, 2.0, False),  # below the band but A > 0: min picks the unclipped term
        (1.5, -2.0, False),  # above the band but A < 0: likewise
    ],
)
def test_clipped_objective_gradient_is_zero_where_clipped_and_minus_a_r_elsewhere(ratio, advantage, cut):
    loss, grad, got_cut = _surrogate_grad(torch.log(torch.tensor(ratio)).item(), advantage)
    assert got_cut == cut
    if cut:
        assert grad == 0.0
        clipped_ratio = min(max(ratio, 0.8), 1.3)
        assert loss == pytest.approx(-clipped_ratio * advantage)
    else:
        # d/d logp of -r A is -r A: the loss falls as logp rises exactly when A > 0.
        assert grad == pytest.approx(-ratio * advantage)
        assert (grad < 0) == (advantage > 0)
        assert loss == pytest.approx(-ratio * advantage)


def test_clipped_objective_at_ratio_one_is_the_policy_gradient():
    torch.manual_seed(1)
    logp = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 0.0], dtype=torch.float64)
    loss, cut = clipped_surrogate(logp, logp.detach(), adv, 0.2, 0.2)
    loss.sum().backward()
    assert not cut.any()
    torch.testing.assert_close(logp.grad, -adv[:, None].expand(3, 4))
    torch.testing.assert_close(loss, -adv[:, None].expand(3, 4))


def test_kl_estimator_values():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -0.5])
    d = ref - logp
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), -d)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), d**2 / 2)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(d) - 1 - d)
    assert torch.equal(kl_penalty(ref, ref, "k3"), torch.zeros(2))
    with pytest.raises(ValueError, match="kl_estimator must be one of"):
        kl_penalty(logp, ref, "exact")


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_expected_kl_gradients_match_the_exact_divergences(estimator):
    """E_{x~p}[d k(x)] over a categorical p (enumerated, float64) against autograd of the exact
    KLs: k2 -> KL(p||q), k3 -> KL(q||p), k1 -> zero. k1's and k3's values are unbiased for KL(p||q)."""
    torch.manual_seed(2)
    z = torch.randn(6, dtype=torch.float64, requires_grad=True)
    q = torch.log_softmax(torch.randn(6, dtype=torch.float64), -1)
    logp = torch.log_softmax(z, -1)
    p = logp.exp().detach()
    values = kl_penalty(logp, q, estimator).to(torch.float64)
    (grad,) = torch.autograd.grad((p * values).sum(), z)
    expected_value = (p * (logp.detach() - q)).sum()
    if estimator != "k2":  # k2's value is biased (low variance); its gradient is the exact one
        assert float((p * values.detach()).sum()) == pytest.approx(float(expected_value), rel=1e-9)
    logp2 = torch.log_softmax(z, -1)
    exact = {
        "k1": torch.zeros((), dtype=torch.float64) * z.sum(),
        "k2": (logp2.exp() * (logp2 - q)).sum(),
        "k3": (q.exp() * (q - logp2)).sum(),
    }[estimator]
    (want,) = torch.autograd.grad(exact, z)
    torch.testing.assert_close(grad, want, atol=1e-6, rtol=1e-4)
