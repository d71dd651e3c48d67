"""End to end: a short GRPO run raises Countdown reward above its starting value (CPU, ~30 s).

The cheap setting: a 1x64 Llama is pre-trained for a few seconds on 8 Countdown-3 problems, each
with its correct solution once and twice with the answer's first operator swapped (wrong), so the
policy starts near 1/3 correct at one decision (about 0.2 overall, sampling slips included) and
the verifier's reward has something to select. GRPO then trains on the same 8 prompts (2 epochs a
batch of 4 x 8 completions). Measured with these seeds (sampled accuracy, 16 completions per
prompt, fresh noise): 0.19 -> 0.53 (seed 0), 0.24 -> 0.66 (1), 0.23 -> 0.69 (2).
"""

from __future__ import annotations

from functools import partial

import lightning as L
import pytest
import torch

from distill.data import RolloutDataModule
from distill.rl import GRPOModule
from distill.rollout import RolloutSampler
from distill.seeds import path_seed
from distill.tasks import countdown
from distill.tasks.registry import get_task

SWAP = {"+": "-", "-": "+", "*": "/", "/": "*"}


def _wrong(solution: str) -> str:
    head, answer = solution.split("<answer>")
    i = next(i for i, c in enumerate(answer) if c in SWAP)
    return f"{head}<answer>{answer[:i]}{SWAP[answer[i]]}{answer[i + 1 :]}"


def _pretrained_policy(path, rows, steps: int = 120):
    from transformers import LlamaForCausalLM

    from distill.models.tiny import char_tokenizer, llama_config
    from distill.models.tiny_world_train import Collator

    tok = char_tokenizer()
    pairs = []
    for r in rows:
        good = countdown.solution(r["numbers"], r["target"])
        bad = _wrong(good)
        assert countdown.score(bad, r["numbers"], r["target"]) == 0.0
        pairs += [(r["prompt"], good), (r["prompt"], bad), (r["prompt"], bad)]
    torch.manual_seed(0)
    config = llama_config(vocab_size=112, hidden_size=64, num_layers=1, num_heads=2)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = (
        tok.pad_token_id,
        tok.eos_token_id,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = Collator(tok)(pairs)
    for _ in range(steps):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def _sampled_accuracy(model, tok, rows, per_prompt: int = 16, seed: int = 123) -> float:
    sampler = RolloutSampler(mix=0.0, max_new_tokens=48, temperature=1.0, vocab_size=len(tok))
    repeated = [r for r in rows for _ in range(per_prompt)]
    enc = tok([r["prompt"] for r in repeated], return_tensors="pt", padding=True)
    texts = sampler.sample(model, model, enc["input_ids"], enc["attention_mask"], seed=seed).completions(tok)
    return sum(countdown.score(t, r["numbers"], r["target"]) for t, r in zip(texts, repeated)) / len(texts)


class RewardLog(L.Callback):
    def __init__(self):
        self.rewards = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rewards.append(float(trainer.callback_metrics["train/reward_mean"]))


@pytest.mark.slow
def test_a_short_grpo_run_raises_countdown_reward(tmp_path):
    data_seed, train_size = 0, 8
    # The prompts the DataModule will train on (its training split for this seed).
    rows = get_task("countdown3").rows(train_size, seed=path_seed("train", data_seed))
    tok = _pretrained_policy(tmp_path / "policy", rows)
    module = GRPOModule(
        student=str(tmp_path / "policy"), optimizer=partial(torch.optim.AdamW, lr=3e-4), text_log={"every": 0}
    )
    data = RolloutDataModule(
        task="countdown3",
        batch_size=4,
        group_size=8,
        train_size=train_size,
        sampling={"max_new_tokens": 48}, evaluation={"val_size": 0},
        seed=data_seed,
    )
    log = RewardLog()
    trainer = L.Trainer(
        max_steps=20,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[log],
    )
    module.configure_model()
    before = _sampled_accuracy(module.student, tok, rows)
    trainer.fit(module, data)
    after = _sampled_accuracy(module.student, tok, rows)
    print(f"sampled accuracy {before:.3f} -> {after:.3f}; rewards {log.rewards}")
    assert 0.05 < before < 0.4  # the setting works as designed: a reward to start from, room to grow
    assert after > before + 0.15, (before, after)
    assert sum(log.rewards[-5:]) / 5 > sum(log.rewards[:5]) / 5
