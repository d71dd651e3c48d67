"""`LiveTensorBytes`: the bytes of live tensor storages and their high-water mark, on any device;
what the memory tests measure `distill.memory`'s formula against."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storages created while it is active and still alive (`now`), and
    their high-water mark (`peak`, `reset_peak()` starts a new one): what
    `torch.cuda.max_memory_allocated` reports on a GPU, measured on any device by watching every
    operator's outputs. Storages made before entering (the weights) are not counted; views share
    their storage's count. Tensor subclasses (DTensor) are skipped."""

    def __init__(self):
        super().__init__()
        self.now = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}

    def reset_peak(self) -> None:
        self.peak = self.now

    def _freed(self, key: int, nbytes: int) -> None:
        self._refs.pop(key, None)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {id(t.untyped_storage()) for t in _plain(tree_leaves((args, kwargs)))}
        for t in _plain(tree_leaves(out)):
            storage = t.untyped_storage()
            key, nbytes = id(storage), storage.nbytes()
            if key in inputs or key in self._refs:  # a view or in-place result: no new memory
                continue
            self._refs[key] = weakref.ref(storage, lambda _, k=key, b=nbytes: self._freed(k, b))
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        return out


def _plain(leaves):
    """The plain tensors (not meta, not a subclass such as DTensor) among pytree leaves."""
    return [t for t in leaves if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"]
