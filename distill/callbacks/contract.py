"""What the measurement callbacks need of the LightningModule they measure, declared as Protocols.

`DistillationModule` and `GRPOModule` satisfy both; any other module works with the callbacks whose
protocol it satisfies. Each callback calls `require` in `setup`, so a module that lacks something
fails before the first step with the names it lacks, not with an `AttributeError` mid-run. What a
training step reports comes separately, typed, in `distill.training.StepResult`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from distill.training import LogitGradSink


@runtime_checkable
class StudentHolder(Protocol):
    """A module holding a causal-LM student to evaluate, update-compare or roll out (`teacher`, if
    present, is read by the samplers only for its special ids and logit width)."""

    student: nn.Module
    tokenizer: object  # a Hugging Face tokenizer
    vocab_size: int  # the tokenizer's real vocabulary; logits past it are embedding padding
    device: torch.device


@runtime_checkable
class LogitGradSource(Protocol):
    """A module that hands `logit_grad_sink.record(...)` its logit gradients while it is set."""

    logit_grad_sink: LogitGradSink | None


def require(pl_module: object, protocol: type, owner: str) -> None:
    """Raise a `TypeError` naming what `pl_module` lacks of `protocol`, needed by `owner`."""
    if isinstance(pl_module, protocol):
        return
    wanted = [name for name in protocol.__annotations__ if not name.startswith("_")]
    missing = [name for name in wanted if not hasattr(pl_module, name)]
    raise TypeError(
        f"{owner} needs a LightningModule with {', '.join(f'`{n}`' for n in wanted)} "
        f"({protocol.__name__}); {type(pl_module).__name__} lacks {', '.join(f'`{n}`' for n in missing)}"
    )
