"""One optimiser step of a module under Lightning, on 1 process or on N `gloo` processes with DDP or
FSDP2 (`ModelParallelStrategy`, the student sharded: `distill.parallel`).

    python tests/ddp_step.py OUT WORLD_DIR DEVICES KINDS [{ddp,fsdp}]   (KINDS: distill, grpo or distill,grpo)

Run by tests/test_ddp.py (not collected by pytest: no test_ prefix). Every rank takes its shard of
one fixed global batch (Lightning's DistributedSampler: rank r gets prompts r, r + N, ...), so the
single-process run on the whole batch is the reference. The distillation module takes one
optimiser step; GRPO takes its `num_iterations` = 2 steps on the batch; both in micro-batches of 2
rows. Each rank writes, for each kind, `OUT/<kind>/rank<r>.json` (its logged `train/*` values) and under DDP
`OUT/<kind>/syncs<r>.json` (its gradient all-reduces); rank 0 also writes `OUT/<kind>/update.pt`, the student's
weights after minus before the step. SGD without clipping makes the update exactly -lr x gradient, so a gradient off by
a factor (DDP averaging local sums over a global count: 1/N) shows in full.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from distill.losses import ReverseKL
from distill.models.forward import eval_no_grad
from distill.module import DistillationModule
from distill.parallel import end_process_group, full_state_dict, is_sharded
from distill.rl import GRPOModule
from distill.rollout import RolloutBatch

PROMPTS, GROUP = 4, 2  # the global batch: 4 prompts x 2 completions (consecutive rows, as GRPO groups)
ROWS, PROMPT = PROMPTS * GROUP, 6


def global_batch(pad_id: int) -> RolloutBatch:
    """Left-padded prompts and completions of unequal lengths (fixed seed)."""
    g = torch.Generator().manual_seed(0)
    lengths = [1, 9, 3, 14, 2, 5, 11, 4]
    total = PROMPT + max(lengths)
    ids = torch.full((ROWS, total), pad_id)
    attn = torch.zeros(ROWS, total, dtype=torch.long)
    comp = torch.zeros(ROWS, total, dtype=torch.bool)
    for i, n in enumerate(lengths):
        p = PROMPT - (i % 3)
        ids[i, PROMPT - p : PROMPT + n] = torch.randint(8, 100, (p + n,), generator=g)
        attn[i, PROMPT - p : PROMPT + n] = 1
        comp[i, PROMPT : PROMPT + n] = True
    teacher = comp & (torch.rand(ROWS, total, generator=g) < 0.5)
    return RolloutBatch(ids, attn, comp, teacher, PROMPT)


class FixedRollouts(L.LightningDataModule):
    """Batches of prompt indices; each prompt's GROUP rows of `global_batch` are its rollouts."""

    def __init__(self, batch: RolloutBatch, per_rank: int):
        super().__init__()
        self.batch, self.per_rank = batch, per_rank

    def train_dataloader(self):
        return DataLoader(list(range(PROMPTS)), batch_size=self.per_rank, shuffle=False)

    def on_after_batch_transfer(self, prompts, dataloader_idx):
        b, index = self.batch, torch.stack([prompts * GROUP + j for j in range(GROUP)], 1).flatten()
        part = RolloutBatch(
            b.input_ids[index],
            b.attention_mask[index],
            b.completion_mask[index],
            b.teacher_token_mask[index],
            PROMPT,
        )
        rows = [{"row": int(i)} for i in index]
        return {"rollout": part, "rows": rows, "task": "countdown3", "group_size": GROUP, "temperature": 1.0}


class FixedRewardGRPO(GRPOModule):
    """Rewards fixed by global row (1 for rows 0, 3, 6): groups with and without signal."""

    def rewards(self, batch):
        rows = batch["rows"]
        return torch.tensor([float(r["row"] % 3 == 0) for r in rows]), [""] * len(rows)


class Record(L.Callback):
    """Each rank's logged `train/*` figures; under DDP also its gradient all-reduces of the batch
    (`syncs<r>.json`), counted by a comm hook that all-reduces as DDP does by default; both in `out`."""

    def __init__(self, out: Path):
        self.out, self.syncs = out, 0

    def on_train_start(self, trainer, pl_module):
        if isinstance(trainer.strategy.model, DistributedDataParallel):
            trainer.strategy.model.register_comm_hook(None, self.count_and_all_reduce)

    def count_and_all_reduce(self, state, bucket):
        self.syncs += bucket.is_last()  # one backward's all-reduce spans every bucket
        return allreduce_hook(None, bucket)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
        rank = trainer.global_rank
        (self.out / f"rank{rank}.json").write_text(json.dumps(logged))
        if isinstance(trainer.strategy.model, DistributedDataParallel):
            (self.out / f"syncs{rank}.json").write_text(json.dumps(self.syncs))


class ScoreInInferenceMode(L.Callback):
    """Before training, one forward of the gathered student under `torch.inference_mode` (how
    Lightning evaluates with NCCL): the training that follows must still run (FSDP2 reuses the
    gathered weights' buffers, which must not become inference tensors) and update as before."""

    def on_train_start(self, trainer, pl_module):
        with torch.inference_mode(), eval_no_grad(pl_module.student):
            pl_module.student(input_ids=torch.tensor([[8, 9, 10]]))


def build(kind: str, world: Path):
    sgd = lambda params: torch.optim.SGD(params, lr=1.0)  # noqa: E731
    if kind == "distill":
        return DistillationModule(
            student=str(world / "student"),
            teacher=str(world / "teacher"),
            divergence=ReverseKL(),
            optimizer=sgd,
            gradient_clip_val=None,
            text_log={"every": 0},
            micro_batch_size=2,
        )
    # Two optimiser passes on the batch: the second is off-policy, so the clipped ratio and the
    # pass-averaged figures (clip_fraction, loss) are exercised too.
    return FixedRewardGRPO(
        student=str(world / "student"),
        optimizer=sgd,
        gradient_clip_val=None,
        text_log={"every": 0},
        objective={"num_iterations": 2},
        micro_batch_size=2,
    )


def strategy(name: str, devices: int):
    if devices == 1:
        return "auto"
    if name == "fsdp":
        return ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    return "ddp"


def step(kind: str, world: Path, devices: int, parallel: str, out: Path) -> None:
    """One module of `kind` through its optimiser step(s); its files in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = build(kind, world)
    module.configure_model()
    before = {k: v.detach().clone() for k, v in module.student.state_dict().items()}
    data = FixedRollouts(global_batch(module.tokenizer.pad_token_id), PROMPTS // devices)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy(parallel, devices),
        max_steps=module.objective.num_iterations if hasattr(module, "objective") else 1,  # one rollout batch
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[Record(out), ScoreInInferenceMode()],
    )
    trainer.fit(module, datamodule=data)
    assert is_sharded(module.student) == (parallel == "fsdp" and devices > 1)
    after = full_state_dict(module.student) or module.student.state_dict()  # every rank: a collective
    if trainer.is_global_zero:
        torch.save({k: after[k] - before[k] for k in before}, out / "update.pt")


if __name__ == "__main__":
    out, world, devices, kinds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    parallel = sys.argv[5] if len(sys.argv) > 5 else "ddp"
    # Both kinds in one launch: the ranks started for the first fit serve the second (Lightning
    # launches them once per process), which halves the test's process start-ups.
    for kind in kinds.split(","):
        step(kind, world, devices, parallel, out / kind)
    end_process_group()
