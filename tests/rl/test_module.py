"""GRPOModule: option checks, the frozen reference, and the step's loss and gradient against an
independent computation (micro-batching, off-policy passes, KL penalty)."""

from __future__ import annotations

import pytest
import torch

from distill.rl import GRPOModule


def _module(policy_dir, **options) -> GRPOModule:
    module = GRPOModule(student=policy_dir, **options)
    module.configure_model()
    return module


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"objective": {"num_iterations": 0}}, "model.objective.num_iterations must be an integer >= 1, got 0"),
        (
            {"objective": {"clip_epsilon": 1.0}},
            r"model.objective.clip_epsilon must be a finite number in \(0, 1\), got 1.0",
        ),
        (
            {"objective": {"clip_epsilon_high": 0.0}},
            "model.objective.clip_epsilon_high must be None or a finite number > 0, got 0.0",
        ),
        ({"objective": {"kl_coef": -0.1}}, "model.objective.kl_coef must be a finite number >= 0"),
        (
            {"objective": {"kl_estimator": "exact"}},
            r"model.objective.kl_estimator must be one of \['k1', 'k2', 'k3'\], got 'exact'",
        ),
        ({"objective": {"kl_cof": 0.1}}, r"model.objective has no setting 'kl_cof'; it has \["),
        ({"micro_batch_size": 0}, "model.micro_batch_size must be None or an integer >= 1"),
        ({"student_dtype": "int8"}, "model.student_dtype must be one of"),
    ],
)
def test_bad_options_fail_before_loading(policy_dir, options, match):
    with pytest.raises(ValueError, match=match):
        GRPOModule(student=policy_dir, **options)


def test_missing_student_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.student: no model directory"):
        GRPOModule(student=str(tmp_path / "nowhere"))


def test_reference_is_frozen_kept_out_of_optimizer_and_checkpoint(policy_dir):
    module = _module(policy_dir)
    assert module.teacher is None and module.logit_grad_sink is None
    assert not module.reference.training
    assert not any(p.requires_grad for p in module.reference.parameters())
    optimizer = module.configure_optimizers()
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in module.student.parameters()}
    keys = list(module.state_dict())
    assert keys and all(k.startswith("student.") for k in keys)


def test_no_reference_without_kl_or_logging(policy_dir):
    assert _module(policy_dir, log_kl_to_start=False).reference is None
    assert _module(policy_dir, log_kl_to_start=False, objective={"kl_coef": 0.1}).reference is not None


def _step(rollouts, module, policy_dir, group_size=4):
    batch = rollouts.batch(rollouts.data(policy_dir, group_size=group_size, sampling={"max_new_tokens": 10}), module)
    step = module.prepare(batch)
    # A random policy never solves Countdown: set non-trivial advantages by hand (one group all zero).
    step.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 2.0, -2.0, 0.1, -0.1])
    return step


def _grads(module):
    return [p.grad.clone() for p in module.student.parameters()]


def test_micro_batches_give_the_same_update_as_one_batch(rollouts, policy_dir):
    grads = {}
    for size in (None, 1, 5):
        module = _module(policy_dir, micro_batch_size=size, objective={"kl_coef": 0.1})
        step = _step(rollouts, module, policy_dir)
        module.accumulate_gradients(step, first=True)
        grads[size] = _grads(module)
    for size in (1, 5):
        for a, b in zip(grads[None], grads[size]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_off_policy_pass_matches_an_independent_computation(rollouts, policy_dir, estimator):
    beta, low, high = 0.3, 0.1, 0.15
    module = _module(
        policy_dir,
        objective={"kl_coef": beta, "kl_estimator": estimator, "clip_epsilon": low, "clip_epsilon_high": high},
    )
    step = _step(rollouts, module, policy_dir)
    module.accumulate_gradients(step, first=True)
    # The first pass ran with the sampling policy (ratio 1) and the reference is the start: KL 0.
    torch.testing.assert_close(step.old_logp, step.ref_logp)
    with torch.no_grad():  # stand-in for an optimiser step: move the policy well away from the start
        for p in module.student.parameters():
            p.add_(0.3 * torch.randn_like(p))
    module.student.zero_grad()
    sums = module.accumulate_gradients(step, first=False)
    got = _grads(module)

    ids, attn = step.rollout.input_ids, step.rollout.attention_mask
    module.student.zero_grad()
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = module.student(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[
        :, :-1, :104
    ]
    logp = torch.log_softmax(logits.double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    ratio = torch.exp(logp - step.old_logp.double())
    a = step.advantages.double()[:, None]
    surrogate = -torch.minimum(ratio * a, ratio.clamp(1 - low, 1 + high) * a)
    d = step.ref_logp.double() - logp
    kl = 0.5 * d**2 if estimator == "k2" else torch.exp(d) - 1 - d
    mask = step.mask.double()
    loss = ((surrogate + beta * kl) * mask).sum() / mask.sum()
    loss.backward()
    assert sums["loss"] == pytest.approx(float(loss.detach()), rel=1e-4)
    for mine, want in zip(got, _grads(module)):
        torch.testing.assert_close(mine, want.float(), atol=1e-6, rtol=1e-3)
    clipped = ((ratio > 1 + high) & (a > 0)) | ((ratio < 1 - low) & (a < 0))
    assert sums["clipped"] == float((clipped.double() * mask).sum()) > 0


def test_zero_advantages_and_no_penalty_give_no_gradient(rollouts, policy_dir):
    module = _module(policy_dir)
    step = _step(rollouts, module, policy_dir)
    step.advantages = torch.zeros(12)
    module.accumulate_gradients(step, first=True)
    assert all(float(g.abs().max()) == 0.0 for g in _grads(module))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"group_size": 1}, "data.group_size must be >= 2 for GRPO"),
        ({"group_size": 4, "sampling": {"temperature": 0.0}}, "data.sampling.temperature must be > 0 for GRPO"),
    ],
)
def test_a_batch_of_unusable_sampling_is_refused(rollouts, policy_dir, options, match):
    module = _module(policy_dir)
    batch = rollouts.batch(rollouts.data(policy_dir, **options), module)
    with pytest.raises(ValueError, match=match):
        module.prepare(batch)


def test_ratios_use_the_temperature_the_batch_was_sampled_at(rollouts, policy_dir):
    module = _module(policy_dir)
    batch = rollouts.batch(rollouts.data(policy_dir, group_size=2, sampling={"temperature": 0.7}), module)
    assert batch["temperature"] == 0.7
    step = module.prepare(batch)
    module.accumulate_gradients(step, first=True)
    ids, attn = step.rollout.input_ids, step.rollout.attention_mask
    with torch.no_grad():
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = module.student(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits
        want = torch.log_softmax(logits[:, :-1, : module.vocab_size] / 0.7, -1).gather(-1, ids[:, 1:, None])[
            ..., 0
        ]
    mask = step.mask.bool()
    torch.testing.assert_close(step.old_logp[mask], want[mask], atol=1e-5, rtol=1e-4)


class FirstKL(__import__("lightning").Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(trainer.callback_metrics["train/kl_to_start"]))


def _kl_at_step_zero(policy_dir, **options) -> float:
    import lightning as L

    from distill.data import RolloutDataModule

    module = _module(policy_dir, text_log={"every": 0}, **options)
    data = RolloutDataModule(
        task="countdown3", batch_size=2, group_size=2, train_size=4, evaluation={"val_size": 0}, sampling={"max_new_tokens": 8}, prompts={"tokenizer": policy_dir},
    )  # fmt: skip
    seen = FirstKL()
    L.Trainer(
        max_steps=1, accelerator="cpu", precision="bf16-mixed", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[seen],
    ).fit(module, data)  # fmt: skip
    return seen.values[0]


def test_kl_to_start_is_zero_at_step_zero_under_mixed_precision(policy_dir):
    """The reference follows the policy's dtype by default, so it is the starting policy bit for bit
   ; a bf16 reference beside a float32 policy has a floor the test can see."""
    assert _kl_at_step_zero(policy_dir) == 0.0
    assert _kl_at_step_zero(policy_dir, reference_dtype="bfloat16") > 0.0
