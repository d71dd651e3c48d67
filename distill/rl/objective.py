"""GRPO's tensor math: group-normalised advantages, per-token log-probs, the clipped surrogate and
the per-token KL penalty. Pure functions, no Lightning (layer 2 conventions: float32 math);
`GRPOObjective`, their settings (`model.objective.*`); and `GRPOBatch`, the tensors one rollout
batch carries through its passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from distill.checks import check_choice, check_int, check_number
from distill.losses import global_sum
from distill.names import KL_ESTIMATORS
from distill.rl.logprobs import token_logprobs_and_kl
from distill.rollout import RolloutBatch

# exp(30) ~ 1e13: a log-ratio past it means a token the policy all but excludes; k3's exp stays finite.
MAX_LOG_RATIO = 30.0


def _wide(x: Tensor) -> Tensor:
    """At least float32 (float64 stays float64, for tests in double precision)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


@dataclass(frozen=True)
class GRPOObjective:
    """What GRPO optimises on a rollout batch: passes, clip ranges, KL penalty, advantages.

    Args:
        num_iterations: optimiser steps (passes, mu) per rollout batch; passes after the first are
            off-policy and rely on the clipped ratio.
        clip_epsilon: lower clip range: the ratio is clipped at 1 - clip_epsilon (in (0, 1)).
        clip_epsilon_high: upper clip range 1 + clip_epsilon_high (> 0; DAPO's clip-higher);
            None = clip_epsilon.
        kl_coef: weight of the KL penalty to the reference (>= 0; 0 = none, as in DAPO and Dr. GRPO).
        kl_estimator: per-token estimator of the penalty: `k1`, `k2` or `k3` (DeepSeekMath's GRPO;
            see `kl_penalty` for what each one's gradient pulls towards).
        scale_rewards: divide centred rewards by their group's std (False: Dr. GRPO, centring only).
        advantage_epsilon: added to the group std before dividing (>= 0).
    """

    num_iterations: int = 1
    clip_epsilon: float = 0.2
    clip_epsilon_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    scale_rewards: bool = True
    advantage_epsilon: float = 1e-4

    def __post_init__(self) -> None:
        check_int("model.objective.num_iterations", self.num_iterations, 1)
        check_number("model.objective.clip_epsilon", self.clip_epsilon, 0, 1, open_min=True, open_max=True)
        check_number(
            "model.objective.clip_epsilon_high", self.clip_epsilon_high, 0, open_min=True, optional=True
        )
        check_number("model.objective.kl_coef", self.kl_coef, 0)
        check_choice("model.objective.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        check_number("model.objective.advantage_epsilon", self.advantage_epsilon, 0)

    @property
    def clip_range(self) -> tuple[float, float]:
        """(low, high): the ratio is clipped to [1 - low, 1 + high]."""
        high = self.clip_epsilon if self.clip_epsilon_high is None else self.clip_epsilon_high
        return float(self.clip_epsilon), float(high)


def check_sampling(group_size: int | None, temperature: float | None) -> None:
    """GRPO needs groups of at least 2 completions per prompt, sampled at a temperature > 0
    (None: not known, not checked)."""
    if group_size is not None and group_size < 2:
        raise ValueError(
            f"data.group_size must be >= 2 for GRPO (advantages compare completions of the same "
            f"prompt), got {group_size}"
        )
    if temperature == 0:
        raise ValueError(
            "data.sampling.temperature must be > 0 for GRPO: greedy decoding makes every group's completions equal"
        )


def group_advantages(
    rewards: Tensor, group_size: int, scale: bool = True, eps: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """Advantages of `rewards` (`[N]`, N = groups x `group_size`, each group's rows consecutive).

    A = (r - mean of its group) / (std of its group + eps) with `scale`, else r - mean (Dr. GRPO,
    which drops the std division to avoid favouring low-variance groups). The std is the sample
    std (n - 1), as TRL computes it. A group whose rewards are all equal carries no signal: its
    advantages are exactly 0 (not a rounding residue).

    Returns (advantages `[N]` float32, zero_signal `[N // group_size]` bool: the all-equal groups).
    """
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [N] with N a multiple of group_size={group_size}, got shape {tuple(rewards.shape)}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    r = rewards.detach().float().view(-1, group_size)
    zero_signal = (r == r[:, :1]).all(dim=1)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.masked_fill(zero_signal[:, None], 0.0).view(-1), zero_signal


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) at `tokens`: `[B, T, V]`, `[B, T]` -> `[B, T]`, computed in
    chunks of positions without a float32 `[B, T, V]` copy (`distill.rl.logprobs`)."""
    return token_logprobs_and_kl(logits, tokens, temperature)[0]


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's clipped objective per token, as a loss: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
    with r = exp(logp - old_logp) (`[B, T]`) and A the row's advantage (`[B]`, or `[B, T]`).

    The gradient is zero where the clipped branch is the smaller one and r lies outside the band
    (r > 1 + clip_high with A > 0, r < 1 - clip_low with A < 0): the policy has already moved far
    enough that way. Elsewhere it is -A r d logp (pushing logp up when A > 0).

    Returns (loss `[B, T]`, clipped `[B, T]` bool: the tokens whose gradient is cut off).
    """
    a = _wide(advantages)
    if a.dim() == 1:
        a = a[:, None]
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = ratio * a
    clipped_value = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped_value)
    cut = ((ratio > 1.0 + clip_high) & (a > 0)) | ((ratio < 1.0 - clip_low) & (a < 0))
    return loss, cut


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Schulman's single-sample estimators of KL(policy || reference) per token, on tokens the
    policy sampled: with d = ref_logp - logp, k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d (`[B, T]`,
    float32 or wider).

    Differentiated through `logp` as a loss term (DeepSeekMath's GRPO uses k3 so), their expected
    gradients differ: k2's is the gradient of KL(policy || reference); k3's that of
    KL(reference || policy) (mass-covering, still a pull towards the reference); k1's is zero in
    expectation. As values, k1 and k3 are unbiased estimates of KL(policy || reference), k2 is
    biased (with lower variance).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {list(KL_ESTIMATORS)}, got {estimator!r}")
    d = (_wide(ref_logp.detach()) - _wide(logp)).clamp(max=MAX_LOG_RATIO)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    return torch.expm1(d) - d


@dataclass
class GRPOBatch:
    """One rollout batch prepared for the passes: rewards, advantages (`[B]`), the completion mask
    and tokens' log-probs (`[B, T-1]`) under the sampling policy and the reference (filled by the
    first pass), and the step's completion-token count."""

    rollout: RolloutBatch
    rewards: torch.Tensor
    texts: list[str]
    advantages: torch.Tensor
    zero_signal: torch.Tensor
    mask: torch.Tensor
    num_items: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    temperature: float = 1.0  # the sampling temperature the ratios' log-probs are taken at


def reward_moments(rewards: Tensor) -> tuple[float, float]:
    """Mean and population std of the rewards of every rank's rows (`global_sum` over ranks; the
    local ones without `torch.distributed`)."""
    stats = torch.stack([rewards.sum(), rewards.square().sum(), rewards.new_tensor(rewards.numel())])
    total, square, rows = global_sum(stats.double()).tolist()
    mean = total / max(rows, 1.0)
    return mean, max(square / max(rows, 1.0) - mean**2, 0.0) ** 0.5
