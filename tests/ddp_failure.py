"""One rank fails, the other is busy: every process must end soon after.

    python tests/ddp_failure.py OUT FAIL_RANK

Run by tests/test_ddp.py (not collected by pytest: no test_ prefix). Two `gloo` ranks under
Lightning's DDP (rank 0 launches rank 1 with its subprocess launcher, as `distill fit
--trainer.devices 2` does) train a linear model; at the second batch rank FAIL_RANK raises in a
callback and writes `OUT/failed_at` (the time), while the other rank sleeps for 10 minutes: a rank
decoding a long rollout, or one blocked in an NCCL collective, which (unlike gloo) does not notice
that its peer has died. `fit` runs inside `distill.parallel.end_launched_ranks_on_failure`, as in
`distill fit` (`DistillCLI.execute`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from distill.parallel import end_launched_ranks_on_failure


class Linear(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FailOnOneRank(L.Callback):
    def __init__(self, out: Path, rank: int):
        self.out, self.rank = out, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx != 1:
            return
        if trainer.global_rank == self.rank:
            (self.out / "failed_at").write_text(repr(time.time()))
            raise RuntimeError(f"boom on rank {self.rank}")
        time.sleep(600)


if __name__ == "__main__":
    out, fail_rank = Path(sys.argv[1]), int(sys.argv[2])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=10,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FailOnOneRank(out, fail_rank)],
    )
    with end_launched_ranks_on_failure(trainer):
        trainer.fit(Linear(), DataLoader(torch.randn(64, 4), batch_size=2))
