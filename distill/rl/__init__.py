"""Reinforcement learning with verifiable rewards after distillation: GRPO.

``objective.py`` holds the tensor math (group advantages, clipped surrogate, KL penalty),
``logprobs.py`` the per-token log-probabilities chunked over positions, ``passes.py`` one rollout
batch's rewards and passes of backward, ``module.py`` the LightningModule that `distill fit` runs
with `configs/*/grpo_*.yaml`.
"""

from distill.rl.module import GRPOModule
from distill.rl.objective import clipped_surrogate, group_advantages, kl_penalty, token_logprobs

__all__ = ["GRPOModule", "clipped_surrogate", "group_advantages", "kl_penalty", "token_logprobs"]
