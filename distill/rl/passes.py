"""GRPO's passes over one rollout batch: the verifier's rewards and the group advantages
(`verifier_rewards`, `prepare`), then one pass of backward over the batch in micro-batches (`accumulate_gradients`),
which `GRPOModule.training_step` runs `num_iterations` times with an optimiser step after each.

Each token's loss is divided by the completion tokens of the whole step (micro-batches and ranks
included). The first pass runs with the sampling policy's parameters: it records the old
log-probabilities of later passes and the reference's.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

import torch

from distill.losses import gradient_denominator, step_token_count
from distill.models.forward import causal_logits, completion_width
from distill.parallel import gradient_sync
from distill.rl.logprobs import token_logprobs_and_kl
from distill.rl.objective import GRPOBatch, clipped_surrogate, group_advantages, kl_penalty
from distill.tasks.registry import get_task

if TYPE_CHECKING:
    from distill.rl.module import GRPOModule


def verifier_rewards(module: GRPOModule, batch: dict) -> tuple[torch.Tensor, list[str]]:
    """Verifier score of each completion (`[B]` float32) and the completions' texts."""
    task = get_task(batch["task"])
    texts = batch["rollout"].completions(module.tokenizer)
    scores = [task.score(text, row) for text, row in zip(texts, batch["rows"])]
    return torch.tensor(scores, dtype=torch.float32, device=batch["rollout"].input_ids.device), texts


def prepare(module: GRPOModule, batch: dict) -> GRPOBatch:
    """Rewards, advantages and masks of a rollout batch (log-prob buffers still empty)."""
    rollout = batch["rollout"]
    rewards, texts = module.rewards(batch)  # a subclass may score otherwise (tests fix rewards)
    advantages, zero_signal = group_advantages(
        rewards,
        int(batch.get("group_size", 1)),
        module.hparams.scale_rewards,
        module.hparams.advantage_epsilon,
    )
    mask = rollout.completion_mask[:, 1:]
    return GRPOBatch(
        rollout=rollout,
        rewards=rewards,
        texts=texts,
        advantages=advantages,
        zero_signal=zero_signal,
        mask=mask,
        num_items=step_token_count([mask]),
        old_logp=torch.zeros(mask.shape, device=mask.device),
        ref_logp=torch.zeros(mask.shape, device=mask.device),
    )


def accumulate_gradients(module: GRPOModule, step: GRPOBatch, first: bool) -> dict[str, float]:
    """One pass of backward over `step` in micro-batches, each token's loss divided by the
    completion tokens of the whole step. The first pass (`first`) runs with the sampling
    policy's parameters, before any optimiser step: it stores its detached log-probs as the old
    log-probs of later passes (saving a no-grad forward) and the reference's log-probs. Returns
    token sums (`loss`: the pass's loss, already normalised) and wall seconds per phase."""
    ids, attn = step.rollout.input_ids, step.rollout.attention_mask
    tokens, mask, num_items = ids[:, 1:], step.mask, step.num_items
    denom = gradient_denominator(num_items.clamp(min=1))  # num_items / world size (DDP averages)
    backward = module.manual_backward if module._trainer is not None else torch.Tensor.backward
    size = module.hparams.micro_batch_size or ids.shape[0]
    sums = dict.fromkeys(("loss", "clipped", "kl_to_start", "kl_penalty", "reference_s", "policy_s"), 0.0)
    starts = range(0, ids.shape[0], size)
    for start in starts:
        # Lean: the last K columns only (`distill.step.accumulate_gradients`).
        keep = completion_width(mask[start : start + size]) if module.hparams.lean_logits else None
        rows = (slice(start, start + size), slice(-keep if keep else None, None))
        m, ref_logits = mask[rows].float(), None
        t0 = time.perf_counter()
        if first and module.reference is not None:
            with torch.no_grad():
                ref_logits = causal_logits(
                    module.reference, ids[rows[0]], attn[rows[0]], module.vocab_size, keep
                )
                step.ref_logp[rows] = token_logprobs_and_kl(ref_logits, tokens[rows], module.temperature)[0]
        t1 = time.perf_counter()
        logits = causal_logits(module.student, ids[rows[0]], attn[rows[0]], module.vocab_size, keep)
        if module.logit_grad_sink is not None:
            logits.register_hook(
                partial(
                    module.logit_grad_sink.record,
                    completion_mask=mask[rows],
                    teacher_token_mask=torch.zeros_like(mask[rows]),
                    num_items=denom,
                )
            )
        # The first pass's KL to the reference comes from the log-probs' own softmaxes.
        logp, kl_to_start = token_logprobs_and_kl(logits, tokens[rows], module.temperature, ref_logits)
        if first:
            step.old_logp[rows] = logp.detach()
            if kl_to_start is not None:
                sums["kl_to_start"] += float((kl_to_start * m).sum())
            del ref_logits
        per_token, cut = clipped_surrogate(
            logp, step.old_logp[rows], step.advantages[rows[0]], module.clip_low, module.clip_high
        )
        if module.hparams.kl_coef > 0:
            kl = kl_penalty(logp, step.ref_logp[rows], module.hparams.kl_estimator)
            per_token = per_token + module.hparams.kl_coef * kl
            sums["kl_penalty"] += float((kl.detach() * m).sum())
        loss = (per_token * m).sum() / denom
        with gradient_sync(module, last=start == starts[-1]):  # DDP: one all-reduce per step
            backward(loss)
        sums["loss"] += float(loss.detach())
        sums["clipped"] += float((cut.float() * m).sum())
        sums["reference_s"] += t1 - t0
        sums["policy_s"] += time.perf_counter() - t1
        del logits, logp, per_token, loss
    return sums
