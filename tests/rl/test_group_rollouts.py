"""RolloutDataModule for GRPO: G completions per prompt, and modules without a teacher."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from distill.data import RolloutDataModule
from distill.models.loading import load_model, load_tokenizer


def _module(policy_dir):
    return SimpleNamespace(student=load_model(policy_dir), teacher=None)


def test_group_size_repeats_each_prompt_on_consecutive_rows(rollouts, policy_dir):
    data = rollouts.data(policy_dir, group_size=4)
    prompts = next(iter(data.train_dataloader()))
    out = rollouts.batch(data, _module(policy_dir))
    rollout = out["rollout"]
    assert out["group_size"] == 4 and rollout.batch_size == 12 and len(out["rows"]) == 12
    assert out["rows"] == [row for row in prompts["rows"] for _ in range(4)]
    prompt_ids = rollout.prompt_ids()
    for g in range(3):
        group = prompt_ids[4 * g : 4 * g + 4]
        assert all(p == group[0] for p in group)
        assert group[0] == prompts["input_ids"][g][prompts["attention_mask"][g].bool()].tolist()
    completions = rollout.completion_ids()
    # The per-row sampling streams differ by occurrence: a group's completions are not copies.
    assert all(len({tuple(c) for c in completions[4 * g : 4 * g + 4]}) > 1 for g in range(3))
    assert not rollout.teacher_token_mask.any()


def test_padded_vocabulary_rows_are_never_sampled(rollouts, policy_dir):
    # The random policy has 112 logit rows for 104 tokens: without the tokenizer's size the sampler
    # draws the 8 padding rows about 7 % of the time.
    out = rollouts.batch(rollouts.data(policy_dir, group_size=8, sampling={"max_new_tokens": 24}), _module(policy_dir))
    rollout = out["rollout"]
    generated = rollout.input_ids[rollout.completion_mask]
    assert generated.numel() > 100
    assert int(generated.max()) < len(load_tokenizer(policy_dir))


def test_group_size_one_keeps_the_batch(rollouts, policy_dir):
    out = rollouts.batch(rollouts.data(policy_dir), _module(policy_dir))
    assert out["group_size"] == 1 and out["rollout"].batch_size == 3


def test_evaluation_batches_are_not_repeated(rollouts, policy_dir):
    data = rollouts.data(
        policy_dir, group_size=4, evaluation={"val_size": 5, "batch_size": 5, "max_new_tokens": 8}
    )
    out = rollouts.batch(data, _module(policy_dir), training=False)
    assert out["rollout"].batch_size == 5 and "group_size" not in out


@pytest.mark.parametrize("options", [{"mix": 0.5}, {"granularity": "speculative"}])
def test_a_module_without_teacher_needs_student_only_rollouts(rollouts, policy_dir, options):
    data = rollouts.data(policy_dir, group_size=2, **options)
    with pytest.raises(ValueError, match="needs a teacher, but SimpleNamespace has none"):
        rollouts.batch(data, _module(policy_dir))


def test_group_size_is_validated():
    with pytest.raises(ValueError, match="data.group_size must be an integer >= 1, got 0"):
        RolloutDataModule(group_size=0)


def test_the_teacher_is_used_when_there_is_one(rollouts, policy_dir):
    module = _module(policy_dir)
    module.teacher = load_model(policy_dir)
    torch.nn.init.zeros_(module.teacher.lm_head.weight)  # uniform: unlike the student's rows
    out = rollouts.batch(rollouts.data(policy_dir, mix=1.0), module)
    assert bool(out["rollout"].teacher_token_mask[out["rollout"].completion_mask].all())


def test_a_prompt_met_again_in_a_later_epoch_gets_fresh_samples(rollouts, policy_dir):
    data, module = rollouts.data(policy_dir, group_size=2), _module(policy_dir)
    first = rollouts.batch(data, module, epoch=0)["rollout"].completion_ids()
    assert rollouts.batch(data, module, epoch=0)["rollout"].completion_ids() == first  # seeded
    later = rollouts.batch(data, module, epoch=1)["rollout"].completion_ids()
    assert sum(a != b for a, b in zip(first, later)) >= len(first) // 2
