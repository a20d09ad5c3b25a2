"""The input pipeline recipe `make_loader`: worker processes (`StageLoader`) or reader threads.

Two loaders yield identical batches (``DataConfig.loader``): DataLoader worker processes write
each item straight into fresh shared memory, so handing it to the main process copies nothing
(best for small samples); reader threads (`stage.threadloader.ThreadLoader`) fill a fixed ring of
preallocated batch buffers, so paper-sized samples (128-512 MiB) do not pay first-touch page
faults of new memory on every read.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from .config import DataConfig
from .dataset import SampleDataset, collate_samples
from .sampler import ShardedBatchSampler
from .threadloader import ThreadLoader


class StageLoader(DataLoader):
    """A DataLoader whose batches come from a `ShardedBatchSampler`; adds set_epoch/skip_batches."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def skip_batches(self, k: int) -> None:
        self.batch_sampler.skip_batches(k)


def _worker_init(worker_id: int) -> None:
    # One intra-op thread per worker: the workers are the parallelism, and oversubscribing the
    # cores slows every worker down.
    torch.set_num_threads(1)


#: delivered cbed bytes per sample from which ``loader: auto`` picks reader threads: the smallest
#: stack measured (1024 x 8 x 8 float16, 128 KiB). From there to the paper's 128-512 MiB stacks the
#: ring delivered 3-6x a worker process's warm rate, which moves every item through freshly
#: allocated shared memory (benchmarks/RESULTS.md, stage, "the loader at study sizes").
THREADS_MIN_SAMPLE_BYTES = 128 << 10


def choose_loader(dataset: SampleDataset, data_cfg: DataConfig) -> str:
    """``processes`` or ``threads`` for ``data_cfg.loader`` (resolving ``auto`` by sample size)."""
    if data_cfg.loader != "auto":
        return data_cfg.loader
    sample_bytes = int(np.prod(dataset.cbed_shape)) * dataset.cbed_dtype.itemsize
    return "threads" if sample_bytes >= THREADS_MIN_SAMPLE_BYTES else "processes"


def make_loader(dataset: SampleDataset, data_cfg: DataConfig | None, batch_size: int, rank: int = 0,
                world_size: int = 1, shuffle: bool = True, seed: int = 0, drop_last: bool | None = None,
                shard_mode: str | None = None, samples_per_rank: int | None = None) -> StageLoader | ThreadLoader:
    """The input pipeline recipe: sharded deterministic batches, parallel reads, prefetch,
    pinned memory when CUDA is available.

    ``data_cfg.loader`` picks worker processes (`StageLoader`) or reader threads over a ring of
    reused buffers (`ThreadLoader`, the default for paper-sized samples; see `choose_loader`).
    Both yield the same batches. ``drop_last`` defaults to ``shuffle`` (training drops the ragged
    batch, evaluation keeps it); ``shard_mode`` defaults to ``data_cfg.shard_mode``;
    ``samples_per_rank`` is the agreed per-rank count of ``shard_mode='local'``.
    """
    cfg = data_cfg if data_cfg is not None else DataConfig()
    drop_last = shuffle if drop_last is None else drop_last
    sampler = ShardedBatchSampler(dataset, batch_size, rank=rank, world_size=world_size, shuffle=shuffle,
                                  seed=seed, drop_last=drop_last, shard_mode=shard_mode or cfg.shard_mode,
                                  samples_per_rank=samples_per_rank)
    workers = cfg.num_workers
    pin = cfg.pin_memory and torch.cuda.is_available()
    if choose_loader(dataset, cfg) == "threads":
        return ThreadLoader(dataset, sampler, threads=workers, prefetch=cfg.prefetch_factor, pin_memory=pin)
    return StageLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate_samples,
                       pin_memory=pin, prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
                       persistent_workers=workers > 0, worker_init_fn=_worker_init if workers > 0 else None)
