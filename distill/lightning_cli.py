"""`distill fit|validate|test`: LightningCLI over any LightningModule (DistillationModule, GRPOModule)
and `RolloutDataModule`, with a run directory.

    distill fit --config configs/tiny/fkl_mix0.yaml --run_dir runs/fkl_mix0
    distill fit --config configs/tiny/fkl_mix0.yaml --print_config

A run directory holds `config.yaml` (the resolved config), `env.json` (package versions, git
revision), `tensorboard/`, `checkpoints/` (`last.ckpt`; no teacher tensors), `student/` (the
exported student) and, written last and atomically, `metrics.json` (`status: finished`, the final
training/validation/test values and the callbacks' summaries). A bad config fails before any model
is loaded with one line naming the field, the value and what is allowed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from distill.data import RolloutDataModule
from distill.runinfo import environment, write_json_atomic


class DistillCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--run_dir", type=str | None, default=None, help="run directory (default: runs/<timestamp>)"
        )
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None, help="checkpoint to resume from or test"
        )
        parser.add_argument(
            "--test_after_fit", type=bool, default=True, help="run the test sets after fitting"
        )
        parser.link_arguments("seed_everything", "data.seed")

    def before_instantiate_classes(self) -> None:
        if not self.config.get("run_dir"):
            self.config.run_dir = str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        run_dir = Path(self.config_init.run_dir)
        callbacks = list(self._get(self.config_init, "trainer", default={}).get("callbacks") or [])
        callbacks.append(ModelCheckpoint(dirpath=run_dir / "checkpoints", save_last=True, save_top_k=0))
        logger = TensorBoardLogger(
            save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False
        )
        return super().instantiate_trainer(
            default_root_dir=str(run_dir), logger=logger, callbacks=callbacks, **kwargs
        )

    def execute(self, command: str) -> dict:
        run_dir = Path(self.config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(self.parser.dump(self.config, skip_none=False))
        write_json_atomic(run_dir / "env.json", environment())
        ckpt = self.config.ckpt_path
        if command != "fit":
            results = getattr(self.trainer, command)(self.model, datamodule=self.datamodule, ckpt_path=ckpt)
            return _flatten(results)
        self.trainer.fit(self.model, datamodule=self.datamodule, ckpt_path=ckpt)
        if self.trainer.interrupted:
            return {}
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if v.numel() == 1}
        self.model.export_student(run_dir / "student")
        if self.config.test_after_fit:
            metrics |= _flatten(self.trainer.test(self.model, datamodule=self.datamodule, verbose=False))
        for callback in self.trainer.callbacks:
            if hasattr(callback, "summary"):
                metrics |= callback.summary()
        write_json_atomic(run_dir / "metrics.json", {"status": "finished", "metrics": metrics})
        return metrics


def _flatten(results: list[dict] | None) -> dict:
    out: dict = {}
    for r in results or []:
        out |= {k: float(v) for k, v in r.items()}
    return out


def run_lightning_cli(argv: list[str]) -> dict:
    command, args = argv[0], argv[1:]
    try:
        cli = DistillCLI(
            L.LightningModule,
            RolloutDataModule,
            subclass_mode_model=True,
            auto_configure_optimizers=False,
            save_config_callback=None,
            run=False,
            args=args,
            parser_kwargs={"prog": f"distill {command}"},
        )
    except (ValueError, FileNotFoundError, TypeError) as err:
        print(f"distill {command}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return cli.execute(command)
