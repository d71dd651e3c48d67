"""Fixtures for the GRPO tests: a small random policy saved like a distillation run's export."""

from __future__ import annotations

import pytest
import torch


def save_policy(path, seed: int = 3, hidden: int = 32, layers: int = 1):
    """A random Llama (112 logit rows for the 104-token char tokenizer) saved with `save_pretrained`
    beside its tokenizer, as `distill fit` exports a student."""
    from transformers import LlamaForCausalLM

    from distill.models.tiny import char_tokenizer, llama_config

    tok = char_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(vocab_size=112, hidden_size=hidden, num_layers=layers, num_heads=2))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def policy_dir(tmp_path):
    return str(save_policy(tmp_path / "student"))


class Rollouts:
    """Helpers that build a `RolloutDataModule` and the batches it hands to `training_step`."""

    @staticmethod
    def data(policy_dir, **options):
        from distill.data import RolloutDataModule

        settings = dict(
            task="countdown3",
            batch_size=3,
            train_size=12,
            sampling={"max_new_tokens": 12},
            prompts={"tokenizer": policy_dir},
        )
        for group in ("sampling", "prompts", "evaluation"):  # a group in `options` adds to the defaults'
            options[group] = settings.pop(group, {}) | options.get(group, {})
        data = RolloutDataModule(**(settings | options))
        data.setup("fit")
        return data

    @staticmethod
    def batch(data, module, training: bool = True, epoch: int = 0) -> dict:
        """The first training (or validation) batch after rollout sampling, with a faked trainer."""
        from types import SimpleNamespace

        data.trainer = SimpleNamespace(
            training=training, testing=False, global_step=0, current_epoch=epoch, lightning_module=module
        )
        batch = next(iter(data.train_dataloader() if training else data.val_dataloader()[0]))
        return data.on_after_batch_transfer(batch, 0)


@pytest.fixture
def rollouts():
    return Rollouts
