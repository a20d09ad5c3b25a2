"""`ShardedBatchSampler`: deterministic per-rank batches for data-parallel training.

Sharding modes:

* ``unique`` (the paper's mode, Laanait et al. 2019): every rank reads a fixed shard of its own —
  whole stores (one per writer/node) when there are at least as many stores as ranks, otherwise
  contiguous blocks of the sample list — and reshuffles only within it each epoch. Stores are
  assigned largest first to the least-loaded rank.
* ``shared``: all ranks draw from all samples through a `torch.utils.data.DistributedSampler`,
  reshuffled globally every epoch.
* ``local``: the dataset is this rank's own data (its shard staged to node-local storage, which
  no other rank can read): the rank reads all of it, reshuffled each epoch, truncated (or
  wrapped) to ``samples_per_rank``, a count the ranks agreed on (the smallest shard) so that
  every rank runs the same number of steps.

All are deterministic given (seed, epoch), and ``skip_batches(k)`` skips the first k batches of
the next epoch without reading them, so a resumed training run sees exactly the batches it would
have seen.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler, Sampler

from namsa.errors import UserError
from namsa.random_streams import TrainingStream, training_seed

from .dataset import SampleDataset
from .errors import EmptyStoreError


class ShardedBatchSampler(Sampler[list[int]]):
    """Deterministic per-rank batches for both sharding modes (see the module docstring).

    ``set_epoch(e)`` selects the epoch's shuffle; ``skip_batches(k)`` makes the next iteration
    start at batch k. Every rank yields the same number of batches (shards are truncated to the
    smallest with ``drop_last``, otherwise padded by wrapping around), so collective operations
    never wait on a rank that ran out of data.
    """

    def __init__(self, dataset: SampleDataset, batch_size: int, *, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True, shard_mode: str = "unique",
                 samples_per_rank: int | None = None):
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is outside world_size {world_size}")
        if shard_mode not in ("unique", "shared", "local"):
            raise UserError(f"unknown shard_mode {shard_mode!r}; use 'unique', 'shared' or 'local'")
        if samples_per_rank is not None and (shard_mode != "local" or samples_per_rank < 1):
            raise UserError(f"samples_per_rank={samples_per_rank} needs shard_mode 'local' and a count >= 1")
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.shard_mode = shard_mode
        self.epoch = 0
        self._skip = 0
        if shard_mode == "shared":  # seeded per epoch in set_epoch (its own stream of the table)
            self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                              seed=training_seed(seed, TrainingStream.SHARED_ORDER),
                                              drop_last=drop_last)
            self.per_rank = len(self.sampler)
        elif shard_mode == "local":
            self.shard = list(range(len(dataset)))  # this rank's own data, whole
            self.per_rank = samples_per_rank or len(self.shard)
        else:
            self.shards = self._unique_shards()
            self.shard = self.shards[rank]
            sizes = [len(s) for s in self.shards]
            self.per_rank = min(sizes) if drop_last else max(sizes)
        n = self.per_rank
        if n == 0 or (drop_last and n < batch_size):
            raise EmptyStoreError(f"{len(dataset)} {dataset.split} samples give rank {rank} of {world_size} no full "
                                  f"batch of {batch_size}; lower the batch size or add data")

    def _unique_shards(self) -> list[list[int]]:
        groups = self.dataset.store_groups()
        if len(groups) >= self.world_size:
            # whole stores per rank (a rank reads only the stores staged on its own node), largest
            # first onto the least-loaded rank, so truncation to equal shards wastes little
            shards: list[list[int]] = [[] for _ in range(self.world_size)]
            for g in sorted(groups, key=len, reverse=True):
                min(shards, key=len).extend(g)
            return shards
        n = len(self.dataset)
        bounds = [round(r * n / self.world_size) for r in range(self.world_size + 1)]
        return [list(range(bounds[r], bounds[r + 1])) for r in range(self.world_size)]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.dataset.set_epoch(self.epoch)  # the epoch keys the dataset's dose augmentation draws
        if self.shard_mode == "shared":  # every rank the same shuffle; torch's own seed + epoch would leave the stream
            self.sampler.seed = training_seed(self.seed, TrainingStream.SHARED_ORDER, self.epoch)
            self.sampler.set_epoch(0)

    def skip_batches(self, k: int) -> None:
        """Start the next iteration at batch ``k`` (to resume mid-epoch exactly)."""
        self._skip = max(0, int(k))

    def rank_indices(self) -> list[int]:
        """Dataset indices this rank visits in the current epoch, in order."""
        if self.shard_mode == "shared":
            return list(self.sampler)
        shard = self.shard
        if self.shuffle:
            seed = training_seed(self.seed, TrainingStream.ORDER, self.epoch, self.rank, self.world_size)
            g = torch.Generator().manual_seed(seed)
            shard = [shard[i] for i in torch.randperm(len(shard), generator=g).tolist()]
        n = self.per_rank
        if len(shard) >= n:
            return shard[:n]
        return [shard[i % len(shard)] for i in range(n)]

    def __iter__(self) -> Iterator[list[int]]:
        indices = self.rank_indices()
        skip, self._skip = self._skip, 0
        for b in range(skip, len(self)):
            yield indices[b * self.batch_size: (b + 1) * self.batch_size]

    def __len__(self) -> int:
        n = self.per_rank
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
