"""Which prompts each rank reads, in what order: samplers for `RolloutDataModule`'s loaders.

Training: `ResumableShuffle`, an epoch's shuffled order as a function of (seed, epoch) alone, sharded
over ranks and restartable mid-epoch, so a resumed run meets the same prompts in the same order.
Evaluation: `EvenBatches` over `RowLists`, every prompt scored once, in as many batches on every rank.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DistributedSampler


class EvenBatches(DistributedSampler):
    """Rank `rank`'s evaluation batches (lists of row indices) over `n` prompts, for a DataLoader with
    `batch_size=None` over `RowLists`. The rank scores its own prompts, rank r gets r, r + world, ...
    (each prompt once: a padding sampler would repeat a few to even the shards out, counting them
    twice in the summed figures), cut into as many batches as every other rank's, so that ranks walk
    their evaluation loops in step (under FSDP each batch's rollout is a collective). A batch holds
    at most `batch_size` prompts (one more only when `batch_size` is 1 and the shards differ in
    length). A `DistributedSampler`, so Lightning injects no sampler of its own."""

    def __init__(self, n: int, batch_size: int, world: int, rank: int):
        super().__init__(range(n), num_replicas=world, rank=rank, shuffle=False)
        own = list(range(rank, n, world))
        count = min(math.ceil(math.ceil(n / world) / batch_size), n // world)
        if count == 0:  # no prompts (val_size or test_size 0)
            self.batches: list[list[int]] = []
            return
        size, extra = divmod(len(own), count)
        bounds = [i * size + min(i, extra) for i in range(count + 1)]
        self.batches = [own[a:b] for a, b in zip(bounds, bounds[1:])]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class RowLists(torch.utils.data.Dataset):
    """`dataset`'s rows by lists of indices (`EvenBatches` hands out whole batches)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: list[int]) -> list[dict]:
        return [self.dataset[i] for i in index]


class ResumableShuffle(DistributedSampler):
    """A shuffled order of `n` items per epoch that can restart mid-epoch, sharded over ranks.

    Epoch `e`'s order is what `DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))`
    yields in its `e`-th pass as Lightning reads it (each pass draws the loader's base seed, then a
    permutation; Lightning stops after `len(loader)` batches, so `RandomSampler`'s trailing draw
    never happens), but it is a function of (seed, epoch) alone, so a resumed run meets the same
    prompts in the same order.
    `resume(epoch, consumed)` makes the next pass start after this rank's first `consumed` items.

    With `num_replicas` ranks, rank r takes items r, r + num_replicas, ... of the epoch's order,
    trimmed to n // num_replicas (every rank runs the same number of steps): the ranks' k-th batches
    of B together are the single-process k-th batch of B x num_replicas. Being a
    `DistributedSampler`, Lightning uses it as it is instead of wrapping it."""

    def __init__(self, n: int, seed: int, num_replicas: int = 1, rank: int = 0):
        super().__init__(range(n), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.n, self.seed = n, seed
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at every epoch start
        if epoch != self.epoch:
            self.epoch, self.skip = epoch, 0

    def resume(self, epoch: int, consumed: int) -> None:
        self.epoch, self.skip = epoch, consumed

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(epoch):  # an earlier pass: the loader's base seed, then its permutation
            torch.empty((), dtype=torch.int64).random_(generator=generator)
            torch.randperm(self.n, generator=generator)
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        return torch.randperm(self.n, generator=generator).tolist()

    def __iter__(self):
        skip, self.skip = self.skip, 0
        shard = self.order(self.epoch)[self.rank :: self.num_replicas][: len(self)]
        return iter(shard[skip:])

    def __len__(self) -> int:  # the full epoch: Lightning counts a resumed epoch's batches itself
        return self.n // self.num_replicas
