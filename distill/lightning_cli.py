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
import warnings
from pathlib import Path

import lightning as L
import yaml
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
            metrics = _flatten(results)
            write_json_atomic(run_dir / f"{command}_metrics.json", {"metrics": metrics})
            return metrics
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


def expand_bases(args: list[str]) -> list[str]:
    """Config files may start from others: a top-level `base: FILE` (or a list; relative to the
    file) is replaced by `--config FILE ... --config <the rest>`, so that LightningCLI deep-merges
    them (jsonargparse's own nested `config:` key replaces a model's `init_args` wholesale)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-c", "--config") and i + 1 < len(args):
            out += _expand_file(args[i + 1], seen=())
            i += 2
            continue
        if arg.startswith("--config="):
            out += _expand_file(arg.split("=", 1)[1], seen=())
        else:
            out.append(arg)
        i += 1
    return out


def _expand_file(path: str, seen: tuple) -> list[str]:
    file = Path(path)
    if not file.is_file():
        return ["--config", path]  # not a file (or an inline YAML string): jsonargparse reports it
    data = yaml.safe_load(file.read_text())
    if not isinstance(data, dict) or "base" not in data:
        return ["--config", path]
    if file.resolve() in seen:
        raise ValueError(f"config {path}: `base` includes form a cycle: {' -> '.join(map(str, seen))}")
    bases = data.pop("base")
    out: list[str] = []
    for base in [bases] if isinstance(bases, str) else bases:
        base_path = file.parent / base
        if not base_path.is_file():
            raise FileNotFoundError(f"config {path}: base {base!r} not found (looked for {base_path})")
        out += _expand_file(str(base_path), (*seen, file.resolve()))
    return out + ["--config", yaml.safe_dump(data)] if data else out


def _one_line(message: str) -> str:
    """The model is a `LightningModule | None` union, so jsonargparse wraps a module's own error in
    a report of every union member; keep the module's line (it names field, value and what is allowed)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and "Union subtypes" in lines[0]:
        causes = [
            ln[2:]
            for ln in lines
            if ln.startswith("- ") and not ln.startswith("- Expected a <class 'NoneType'>")
        ]
        if causes:
            return causes[0]
    return " ".join(lines) if len(lines) <= 3 else lines[0]


def run_lightning_cli(argv: list[str]) -> dict:
    command, args = argv[0], argv[1:]
    # `distill fit ARGS` hands ARGS to LightningCLI explicitly; its warning about sys.argv is moot.
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    # The frozen teacher (or GRPO's reference) is in eval mode on purpose.
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training.*")
    try:
        args = expand_bases(args)
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
        print(f"distill {command}: error: {_one_line(str(err))}", file=sys.stderr)
        raise SystemExit(2) from None
    return cli.execute(command)
