"""Sharded training with FSDP2 (`torch.distributed.fsdp.fully_shard`) under Lightning's
`ModelParallelStrategy`: the student's parameters, gradients and optimiser state are split across
the data-parallel ranks; the frozen teacher (or GRPO's reference) stays whole on every rank.

Why the teacher is not sharded: every generated token reads the whole teacher, so a sharded teacher
would be all-gathered once per decode step (16 GB per token for an 8B teacher in bf16). It is
read-only, holds no gradient or optimiser state, and is the same on every rank: replicating it
costs its weights once per GPU and no communication.

Generation, evaluation and the measurement callbacks run their forwards inside `gathered(...)`: the
student's shards are all-gathered once, kept whole while the model decodes or scores, and
resharded afterwards. Inside, a forward is local (no collective), so ranks may decode different
numbers of tokens or score different numbers of row chunks; what must match across ranks is only
the number of `gathered` blocks, which is one per rollout batch, evaluation batch or measurement
(every rank walks the same number of them: `RolloutDataModule` gives every rank equally many
evaluation batches). Training forwards and backwards stay sharded (FSDP2's per-layer all-gather and
reduce-scatter); every rank takes the same number of micro-batches.

Outside FSDP (one process, DDP) every helper here is a no-op or the identity, except the DDP ones:
`keep_out_of_ddp` (the frozen model stays out of DDP's start-up broadcast), `gradient_sync` (one
gradient all-reduce per optimiser step, not per micro-batch) and `end_launched_ranks_on_failure`
(one rank's failure ends every rank).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The FSDP2-managed submodules of `model` (itself included), outermost first; [] if none (or
    if `model` is not a module: a stand-in, or None before the models are loaded)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, nn.Module):
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module) -> bool:
    return bool(fsdp_modules(model))


def shard_model(model: nn.Module, device_mesh, owner: str) -> nn.Module:
    """`fully_shard` each transformer block of a Hugging Face model (the classes its
    `_no_split_modules` names), then the rest of it (embeddings, final norm, LM head) as the root
    group, over the mesh's `data_parallel` dimension. `device_mesh` is the strategy's
    (`LightningModule.device_mesh`: None outside `ModelParallelStrategy`, and the model is left as
    it is, as it is when already sharded); its tensor-parallel dimension must have size 1 (no
    tensor parallel plan exists for these models here)."""
    from torch.distributed.fsdp import fully_shard

    if device_mesh is None or is_sharded(model):
        return model
    names = device_mesh.mesh_dim_names or ()
    tp = device_mesh["tensor_parallel"].size() if "tensor_parallel" in names else 1
    if tp != 1:
        raise ValueError(
            f"{owner}: trainer.strategy.tensor_parallel_size must be 1 (distill shards the student with "
            f"FSDP2 only; there is no tensor-parallel plan), got {tp}"
        )
    mesh = device_mesh["data_parallel"] if "data_parallel" in names else device_mesh
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    if not layers:
        raise ValueError(
            f"{owner}: cannot find the transformer blocks of {type(model).__name__} to shard "
            f"(its _no_split_modules is {sorted(blocks)!r})"
        )
    # Blocks reshard after their forward (gathered again in backward); the root unit (embeddings,
    # the LM head, the final norm) stays whole from forward to backward, which reads it at once.
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        layer._distill_reshard_after_forward = True  # what `gathered` restores on leaving
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    model._distill_reshard_after_forward = False
    return model


_GATHERED: set[int] = set()  # ids of the FSDP modules inside a `gathered` block


@contextmanager
def gathered(*models: nn.Module) -> Iterator[None]:
    """Keep every FSDP2-sharded model among `models` whole for the block: all-gather its shards
    once, keep them through every forward inside (no per-forward collective), reshard at the end
    and restore each unit's resharding after forward (`shard_model`'s choice). A collective when
    any model is sharded: every rank must enter the block the same number of times. Nested blocks
    leave the outer one's modules alone; a no-op for models not sharded.

    The gathered weights are allocated outside inference mode even inside it (Lightning evaluates
    under `torch.inference_mode` with NCCL): FSDP2 reuses those buffers for training forwards,
    which may not write to inference tensors."""
    sharded = {id(m): m for model in models for m in fsdp_modules(model) if id(m) not in _GATHERED}
    if not sharded:
        yield
        return
    with ExitStack() as stack:
        for key, module in sharded.items():
            after = getattr(module, "_distill_reshard_after_forward", True)
            _GATHERED.add(key)
            stack.callback(_GATHERED.discard, key)
            stack.callback(module.set_reshard_after_forward, after, recurse=False)
            stack.callback(_outside_inference_mode, module.reshard)
            module.set_reshard_after_forward(False, recurse=False)
            _outside_inference_mode(module.unshard)
        yield


def _outside_inference_mode(call) -> None:
    with torch.inference_mode(False):
        call()


def keep_out_of_ddp(module: nn.Module, *frozen: str) -> None:
    """Name every parameter and buffer of `module`'s frozen submodules `frozen` (attribute names;
    those still None are skipped) in `module._ddp_params_and_buffers_to_ignore`, which torch's
    `DistributedDataParallel` reads when it wraps `module` (Lightning wraps the LightningModule
    itself): otherwise DDP broadcasts them from rank 0 at start-up (16 GB for an 8B bf16 teacher;
    every rank loads the same weights anyway) and syncs their buffers before every step. Frozen
    parameters are never in DDP's gradient buckets (it buckets `requires_grad` ones only). Call
    after the models load, before the strategy wraps `module`."""
    prefixes = tuple(f"{name}." for name in frozen if getattr(module, name, None) is not None)
    tensors = [*module.named_parameters(), *module.named_buffers()]
    module._ddp_params_and_buffers_to_ignore = [n for n, _ in tensors if prefixes and n.startswith(prefixes)]


def gradient_sync(module, last: bool) -> AbstractContextManager:
    """The context of one micro-batch's backward in a step that accumulates several: under DDP the
    gradients are all-reduced only in the step's `last` backward (the others accumulate locally in
    DDP's `no_sync`, Lightning's `block_backward_sync`), once per optimiser step instead of once per
    micro-batch; the sum, hence the update, is the same. A no-op otherwise: one process, no trainer,
    FSDP2 (which reduce-scatters each backward's gradients so as not to keep them whole)."""
    trainer = getattr(module, "_trainer", None)
    block = getattr(getattr(trainer, "strategy", None), "block_backward_sync", None)
    return nullcontext() if last or block is None else block()


@contextmanager
def end_launched_ranks_on_failure(trainer, run_dir=None) -> Iterator[None]:
    """Run the block; if it fails (any exception but a clean `SystemExit`) in a process that
    launched the other ranks (Lightning's subprocess launcher: `distill fit --trainer.devices N`
    starts ranks 1..N-1 from rank 0), kill them before re-raising, so that none waits for the
    failed rank in its next collective until the process group's timeout (30 minutes under NCCL).
    A run stopped by a signal (its status record in `run_dir` says `interrupted`) is ending on
    every rank at the same step: those get the stop's grace to finish before they are killed.

    Lightning covers the other direction itself (its launcher's process observer kills every
    process when a rank > 0 exits with an error) and rank 0 only for a KeyboardInterrupt
    (`lightning.pytorch.trainer.call._call_and_handle_interrupt`); torchrun ends every worker
    when one fails; under SLURM use `srun --kill-on-bad-exit=1`."""
    try:
        yield
    except BaseException as err:
        if not (isinstance(err, SystemExit) and not err.code):
            end_launched_ranks(trainer, err, run_dir)
        raise


def end_launched_ranks(trainer, err: BaseException, run_dir=None) -> None:
    """End the rank processes this process launched and are still running (none: a no-op), with
    one line on stderr that names the rank that failed first (its status record says which, and
    why; else this one)."""
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    from distill import run_status
    from distill.stopping import grace_seconds, wait_for_ranks

    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return
    running = [proc for proc in launcher.procs if proc.poll() is None]
    record = run_status.read(run_dir) if run_dir is not None else None
    if record is not None and record.get("attempt") != run_status.attempt_id():
        record = None
    if record is not None and record["state"] == "interrupted":
        wait_for_ranks(running, grace_seconds())
        return
    if running:
        if record is not None and record["state"] == "failed":
            rank, reason = record.get("rank", 0), record.get("reason")
        else:
            rank, reason = 0, run_status.error_reason(err)
        print(
            f"distill: rank {rank} failed ({reason}); ending the {len(running)} rank(s) rank 0 launched",
            file=sys.stderr,
        )
        sys.stderr.flush()
    for proc in running:
        proc.kill()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective), any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """A sharded model's whole state dict, gathered on rank 0's CPU (a collective: every rank calls
    it; the others get an empty dict). None for a model that is not sharded: `save_pretrained`
    then reads the model itself."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def end_process_group() -> None:
    """Destroy the default process group once a launch's work is done, on every rank. One left to
    the interpreter's exit can abort the process in its destructors ("terminate called without an
    active exception", exit status -6) after a run that finished, which a sweep would read as a
    failed run."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
