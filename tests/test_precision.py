"""Rollouts, evaluation and the callbacks run under the step's precision:
Lightning autocasts only inside `*_step`, so without `distill.precision.step_precision` a float32
student would sample in float32 while it is trained as the bf16-autocast policy."""

from __future__ import annotations

import lightning as L
import torch

from distill.callbacks import Forgetting
from distill.data import RolloutDataModule
from distill.losses import ForwardKL
from distill.models.forward import causal_logits
from distill.module import DistillationModule
from distill.precision import step_precision
from distill.rollout import RolloutSampler


class Phase(L.Callback):
    """Labels every LM-head call of the student with the phase it ran in: `step` inside the
    training step, `hooks` everywhere else (rollouts, evaluation sampling, callbacks)."""

    def __init__(self, student):
        self.phase, self.calls = "hooks", []
        student.lm_head.register_forward_hook(
            lambda mod, inp, out: self.calls.append((self.phase, out.dtype))
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.phase = "step"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.phase = "hooks"


def test_rollouts_evaluation_and_callbacks_compute_in_the_steps_precision(quick_world):
    module = DistillationModule(
        student=str(quick_world / "student"), teacher=str(quick_world / "teacher"), divergence=ForwardKL()
    )
    module.configure_model()
    data = RolloutDataModule(
        task="countdown3", batch_size=2, train_size=4, evaluation={"val_size": 2, "batch_size": 2, "max_new_tokens": 6}, sampling={"max_new_tokens": 6},
    )  # fmt: skip
    phase = Phase(module.student)
    forgetting = Forgetting(sets=["addition"], num_examples=2, every_n_steps=1, max_new_tokens=4)
    trainer = L.Trainer(
        max_steps=2, accelerator="cpu", precision="bf16-mixed", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, val_check_interval=2, num_sanity_val_steps=0,
        callbacks=[phase, forgetting],
    )  # fmt: skip
    trainer.fit(module, data)
    assert module.student.lm_head.weight.dtype == torch.float32  # float32 weights, bf16 compute
    steps = [dtype for where, dtype in phase.calls if where == "step"]
    hooks = [dtype for where, dtype in phase.calls if where == "hooks"]
    assert steps and set(steps) == {torch.bfloat16}
    # Training rollouts (2 steps x 6 decode steps), validation sampling and Forgetting's probes.
    assert len(hooks) > 12 and set(hooks) == {torch.bfloat16}, sorted(set(hooks), key=str)


def test_step_zero_log_probs_of_sampled_tokens_match_the_step(quick_world):
    """At step 0 the sampled tokens' log-probabilities under the sampler equal the step's (the
    teacher-forced student pass under the step's context) to bf16 rounding."""
    module = DistillationModule(
        student=str(quick_world / "student"), teacher=str(quick_world / "teacher"), divergence=ForwardKL()
    )
    module.configure_model()
    student, tok = module.student, module.tokenizer
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False)
    sampled: list[torch.Tensor] = []
    hook = student.lm_head.register_forward_hook(lambda mod, inp, out: sampled.append(out[:, -1].float()))
    enc = tok(["Use 3 4 5 to make 12.\n", "Use 10 2 7 to make 15.\n"], return_tensors="pt", padding=True)
    sampler = RolloutSampler(mix=0.0, max_new_tokens=8, temperature=1.0).use_tokenizer(tok)
    with step_precision(trainer):
        rollout = sampler.sample(student, student, enc["input_ids"], enc["attention_mask"], seed=3)
    hook.remove()
    width = rollout.input_ids.shape[1] - rollout.prompt_length
    new = rollout.input_ids[:, rollout.prompt_length :]
    by_sampler = torch.stack(sampled[:width], 1)[..., : len(tok)].log_softmax(-1)
    by_sampler = by_sampler.gather(-1, new[..., None])[..., 0]
    with trainer.precision_plugin.train_step_context(), torch.no_grad():
        logits = causal_logits(student, rollout.input_ids, rollout.attention_mask, len(tok), keep=width)
    by_step = logits.float().log_softmax(-1).gather(-1, new[..., None])[..., 0]
    mask = rollout.completion_mask[:, rollout.prompt_length :]
    assert logits.dtype == torch.bfloat16 and sampled[0].dtype == torch.float32  # .float() of bf16 output
    diff = (by_sampler - by_step)[mask].abs()
    assert diff.max() < 0.05, diff  # bf16 keeps 8 bits of mantissa: logits round at ~1e-2
