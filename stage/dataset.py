"""The torch input pipeline: `SampleDataset` over one or many stores and the `make_loader` recipe.

The only module of `stage` that imports torch. Stores are opened lazily, read-only and lock-free
in each worker process (kernel readahead off for small records, on for large ones that are read
whole: see `stage.store.StoreReader`). Two loaders yield identical batches (`make_loader`,
``DataConfig.loader``): DataLoader worker processes write each item straight into fresh shared
memory, so handing it to the main process copies nothing (best for small samples); reader
threads (`ThreadLoader`) fill a fixed ring of preallocated batch buffers, so paper-sized samples
(128-512 MiB) do not pay first-touch page faults of new memory on every read. Sharding for
data-parallel training:

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

Both are deterministic given (seed, epoch), and ``skip_batches(k)`` skips the first k batches of
the next epoch without reading them, so a resumed training run sees exactly the batches it would
have seen.
"""
from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, default_collate, get_worker_info

from namsa.errors import UserError

from .config import DataConfig
from .errors import CorruptRecordError, EmptyStoreError
from .normalize import Normalizer
from .splits import SPLITS
from .store import open_stores


class SampleDataset(Dataset):
    """Samples of one split of one or many stores, as normalised float32 tensors.

    Items: ``{"cbed": float32 (S, P, P), "target": float32 (C, T, T), "index": int}`` where the C
    target channels follow ``targets`` (``potential`` in V*Angstrom, ``density`` in e/Angstrom^2,
    both standardised by ``normalizer``). ``normalizer=None`` returns unnormalised float32.
    ``raw_cbed=True`` returns cbed as stored (float16 intensities times ``item["cbed_scale"]``,
    untransformed) so the transform can run on the GPU after an fp16 host-to-device copy (half
    the PCIe bytes): `batch_to_device(batch, device, normalizer)` does both. ``skip_corrupt=True`` replaces a corrupt record by the next readable one
    (with a warning naming it) instead of failing the epoch.
    """

    def __init__(self, paths: Any, split: str | None, normalizer: Normalizer | None,
                 targets: Sequence[str] = ("potential",), max_samples: int | None = None, *,
                 raw_cbed: bool = False, skip_corrupt: bool = False, verify: bool = True,
                 readahead: bool | None = None):
        if split is not None and split not in SPLITS:
            raise UserError(f"unknown split {split!r}; use one of {SPLITS} (or None for all samples)")
        bad = [t for t in targets if t not in ("potential", "density")]
        if bad or not targets:
            raise UserError(f"unknown targets {list(targets)}; choose from ('potential', 'density')")
        self.stores = open_stores(paths, verify=verify, readahead=readahead)
        self.split = split
        self.normalizer = normalizer
        self.targets = tuple(targets)
        self.raw_cbed = raw_cbed
        self.skip_corrupt = skip_corrupt
        self.global_indices = self.stores.indices(split)
        if max_samples is not None:
            self.global_indices = self.global_indices[: max(0, int(max_samples))]
        if not self.global_indices:
            raise EmptyStoreError(f"no {split} samples in {self.stores.describe()}; simulate more materials "
                                  f"or change data.split_fractions")
        self.storage_scale = self.stores.storage_scale
        self.stores.close()  # workers open their own handles; the parent keeps none across fork()

    def __len__(self) -> int:
        return len(self.global_indices)

    @property
    def cbed_shape(self) -> tuple[int, ...]:
        return tuple(self.stores.manifest["arrays"]["cbed"]["shape"])

    @property
    def target_shape(self) -> tuple[int, ...]:
        return (len(self.targets), *self.stores.manifest["arrays"]["potential"]["shape"])

    def sample_id(self, index: int) -> str:
        reader, j = self.stores.locate(self.global_indices[index])
        return reader.ids()[j]

    def store_groups(self) -> list[list[int]]:
        """Dataset indices grouped by the store they live in (stores in order)."""
        groups = []
        for rng in self.stores.store_ranges():
            group = [k for k, g in enumerate(self.global_indices) if g in rng]
            if group:
                groups.append(group)
        return groups

    def _read(self, index: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        reader, j = self.stores.locate(self.global_indices[index])
        # Normalised or raw items take the stored values (the Normalizer knows their scale);
        # unnormalised float32 items are physical intensities.
        physical = self.normalizer is None and not self.raw_cbed
        arrays, _ = reader.read_arrays(j, names=("cbed", *self.targets), dtype=np.float32, out=out,
                                       physical=physical)
        return arrays

    def __getitem__(self, index: int) -> dict[str, Any]:
        cbed = _shared_empty(self.cbed_shape, self.cbed_dtype)
        target = np.empty(self.target_shape, np.float32)
        self.read_into(index, cbed.numpy(), target)
        item = {"cbed": cbed, "target": torch.from_numpy(target), "index": index}
        if self.raw_cbed:
            item["cbed_scale"] = self.storage_scale
        return item

    @property
    def cbed_dtype(self) -> np.dtype:
        """dtype of delivered cbed: as stored with ``raw_cbed``, else float32."""
        return np.dtype(self.stores.manifest["arrays"]["cbed"]["dtype"]) if self.raw_cbed else np.dtype(np.float32)

    def read_into(self, index: int, cbed: np.ndarray, target: np.ndarray) -> None:
        """Read item ``index`` into preallocated arrays: ``cbed`` (S, P, P) of `cbed_dtype` and
        ``target`` (C, T, T) float32, transformed exactly as `__getitem__` does (it calls this).
        Every record's checksum is verified; ``skip_corrupt`` substitutes as documented above."""
        out = {"cbed": cbed, **{t: target[c] for c, t in enumerate(self.targets)}}
        arrays = self._read_or_substitute(index, out)
        if not self.raw_cbed and self.normalizer is not None:
            self.normalizer.cbed(arrays["cbed"], inplace=True, stored_scale=self.storage_scale)
        if self.normalizer is not None:
            for c, t in enumerate(self.targets):
                target[c] = self.normalizer.target(target[c], t)

    def _read_or_substitute(self, index: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for attempt in range(len(self)):
            k = (index + attempt) % len(self)
            try:
                return self._read(k, out)
            except CorruptRecordError as exc:
                if not self.skip_corrupt:
                    raise
                warnings.warn(f"skipping corrupt record: {exc}", RuntimeWarning, stacklevel=2)
        raise EmptyStoreError(f"every {self.split} record in {self.stores.describe()} is corrupt; re-stage the data")


def _shared_empty(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """An uninitialised tensor; inside a DataLoader worker it lives in shared memory from the
    start, so handing it to the main process copies nothing (torch would otherwise copy every
    item into shared memory when collating)."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch_dtype)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)  # what default_collate uses for its batches
    return torch.empty(0, dtype=torch_dtype).set_(storage, 0, shape)


def collate_samples(items: list[dict[str, Any]]) -> dict[str, Any]:
    """default_collate, except that a batch of one is a view (no copy of a 128-512 MiB stack)."""
    if len(items) == 1:
        return {k: (v.unsqueeze(0) if torch.is_tensor(v) else torch.tensor([v])) for k, v in items[0].items()}
    return default_collate(items)


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
        if shard_mode == "shared":
            self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                              seed=seed, drop_last=drop_last)
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
        if self.shard_mode == "shared":
            self.sampler.set_epoch(self.epoch)

    def skip_batches(self, k: int) -> None:
        """Start the next iteration at batch ``k`` (to resume mid-epoch exactly)."""
        self._skip = max(0, int(k))

    def rank_indices(self) -> list[int]:
        """Dataset indices this rank visits in the current epoch, in order."""
        if self.shard_mode == "shared":
            return list(self.sampler)
        shard = self.shard
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 101 + self.rank)
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


#: delivered cbed bytes per sample from which ``loader: auto`` picks reader threads (one 1024 x
#: 64 x 64 float16 stack is 8 MiB, every paper-shaped stack 128-512 MiB): above it, first-touching
#: each item's fresh shared memory costs more than reading it (benchmarks/RESULTS.md, stage).
THREADS_MIN_SAMPLE_BYTES = 16 << 20


class ThreadLoader:
    """Reader threads filling a fixed ring of preallocated batch buffers (``loader: threads``).

    Same batches as `StageLoader` (same `ShardedBatchSampler`, same `SampleDataset.read_into`,
    so identical values, order, ``set_epoch``/``skip_batches`` and dict layout), but no
    allocation in steady state: the DataLoader's worker processes put every 128-512 MiB item
    into freshly allocated shared memory whose first-touch page faults cost more than the read
    itself. Here ``threads`` reader threads copy each record out of the LMDB map (checksum
    verified) straight into a slot of a ring of ``prefetch + 2`` batch buffers (pinned when
    ``pin_memory`` and CUDA is available); numpy's copy, cast and the transforms release the GIL,
    so the threads overlap. ``threads=0`` reads in the calling thread.

    Lifetime of a batch: its tensors are views of a ring slot that is refilled ``prefetch + 2``
    batches later, i.e. while the next batch is being fetched. Holding batch k while fetching
    batch k+1 is safe (the ring depth guarantees it; a non-blocking copy to the GPU of batch k
    has completed by then); a consumer that keeps batches longer must ``clone()`` them.
    Starting a new iteration ends the previous one (its pending reads are cancelled or finished
    first), like a DataLoader.
    """

    def __init__(self, dataset: SampleDataset, batch_sampler: ShardedBatchSampler, *, threads: int,
                 prefetch: int, pin_memory: bool):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.threads = max(0, int(threads))
        self.prefetch = max(1, int(prefetch)) if self.threads else 0
        self.depth = self.prefetch + 2
        self.pin_memory = pin_memory
        self.ring: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._active: _RingIterator | None = None

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def skip_batches(self, k: int) -> None:
        self.batch_sampler.skip_batches(k)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._active is not None:
            self._active.close()
        self._prepare()
        self._active = _RingIterator(self, list(self.batch_sampler))
        return self._active

    def _prepare(self) -> None:
        """Allocate the ring and the threads once; open the stores here so that the threads
        share one LMDB environment per store (LMDB forbids opening one twice in a process)."""
        if not self.ring:
            b = self.batch_sampler.batch_size
            ds = self.dataset
            dtype = torch.from_numpy(np.empty(0, ds.cbed_dtype)).dtype
            for _ in range(self.depth):
                self.ring.append((torch.empty((b, *ds.cbed_shape), dtype=dtype, pin_memory=self.pin_memory),
                                  torch.empty((b, *ds.target_shape), dtype=torch.float32, pin_memory=self.pin_memory)))
        if self.threads and self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="stage-reader")
        for reader in self.dataset.stores.readers:
            reader.env  # noqa: B018 (opens it in this process)

    def close(self) -> None:
        """End the current iteration, stop the reader threads and unmap the stores (the next
        iteration restarts them)."""
        if self._active is not None:
            self._active.close()
            self._active = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self.dataset.stores.close()

    def __del__(self) -> None:
        # never block here: the cyclic GC may run this on any thread, even one of our own readers
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


class _RingIterator:
    """One epoch of a `ThreadLoader`: batch b is read into ring slot b % depth."""

    def __init__(self, loader: ThreadLoader, batches: list[list[int]]):
        self.loader = loader
        self.batches = batches
        self.submitted = 0  # batches handed to the threads
        self.delivered = 0
        self.pending: deque[list[Future]] = deque()
        for _ in range(min(loader.prefetch, len(batches))):
            self._submit()

    def _slot(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        cbed, target = self.loader.ring[b % self.loader.depth]
        return cbed.numpy(), target.numpy()

    def _submit(self) -> None:
        cbed, target = self._slot(self.submitted)
        read = self.loader.dataset.read_into
        executor = self.loader._executor
        self.pending.append([executor.submit(read, idx, cbed[i], target[i])
                             for i, idx in enumerate(self.batches[self.submitted])])
        self.submitted += 1

    def __iter__(self) -> _RingIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        b = self.delivered
        if b >= len(self.batches):
            raise StopIteration
        # Batch b + prefetch goes into the slot of batch b - 2: the consumer may still hold b - 1.
        if self.loader.threads and self.submitted < len(self.batches):
            self._submit()
        try:
            if self.loader.threads:
                for future in self.pending.popleft():
                    future.result()
            else:
                cbed, target = self._slot(b)
                for i, idx in enumerate(self.batches[b]):
                    self.loader.dataset.read_into(idx, cbed[i], target[i])
        except BaseException:
            self.close()
            raise
        self.delivered += 1
        return self._batch(b)

    def _batch(self, b: int) -> dict[str, Any]:
        """The batch dict of `collate_samples` (same keys, dtypes and shapes) over the ring slot."""
        indices = self.batches[b]
        n = len(indices)
        cbed, target = self.loader.ring[b % self.loader.depth]
        batch = {"cbed": cbed[:n], "target": target[:n], "index": torch.tensor(indices)}
        ds = self.loader.dataset
        if ds.raw_cbed:
            # default_collate turns python floats into float64; a batch of one goes through torch.tensor
            batch["cbed_scale"] = torch.tensor([ds.storage_scale] * n, dtype=torch.float32 if n == 1 else torch.float64)
        return batch

    def close(self) -> None:
        """Cancel the reads not started and wait for the running ones (they write into the ring)."""
        running = []
        for futures in self.pending:
            running += [f for f in futures if not f.cancel()]
        self.pending.clear()
        wait(running)
        self.delivered = len(self.batches)


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


def batch_to_device(batch: dict[str, Any], device: torch.device | str, normalizer: Normalizer | None = None
                    ) -> dict[str, Any]:
    """Move a batch to ``device`` (non-blocking from pinned memory); with ``normalizer``, a raw
    fp16 cbed batch (``SampleDataset(raw_cbed=True)``, recognised by its ``cbed_scale``) is
    transformed on the device; already normalised batches are only moved."""
    out = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
    if normalizer is not None and "cbed_scale" in batch:
        out["cbed"] = normalizer.cbed(out["cbed"], stored_scale=float(batch["cbed_scale"][0]))
    return out

