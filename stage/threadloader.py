"""`ThreadLoader`: reader threads filling a fixed ring of reused batch buffers (``loader: threads``)."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from .dataset import SampleDataset
from .ringguard import SlotGuard, slot_guard
from .sampler import ShardedBatchSampler


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
    batch k+1 is safe (the ring depth guarantees it); a consumer that keeps batches longer must
    ``clone()`` them. A non-blocking copy to the GPU may still be reading the slot when the host
    moves on: each slot has a guard (`stage.ringguard`, a CUDA event for a pinned ring) that
    `stage.dataset.batch_to_device` records after enqueueing the copies and that the reader waits
    on before refilling the slot, so no training-step synchronisation is relied on.
    Starting a new iteration ends the previous one (its pending reads are cancelled or finished
    first), like a DataLoader.
    """

    def __init__(self, dataset: SampleDataset, batch_sampler: ShardedBatchSampler, *, threads: int,
                 prefetch: int, pin_memory: bool, guard_factory: Callable[[], SlotGuard] | None = None):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.threads = max(0, int(threads))
        self.prefetch = max(1, int(prefetch)) if self.threads else 0
        self.depth = self.prefetch + 2
        self.pin_memory = pin_memory
        self.ring: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.guards: list[SlotGuard] = []  # one per ring slot, see `stage.ringguard`
        self._guard_factory = guard_factory or (lambda: slot_guard(pin_memory))
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
                self.guards.append(self._guard_factory())
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


class RingBatch(dict):
    """A batch over a ring slot: the dict `collate_samples` gives, plus the slot's guard, which
    the consumer records once the copies out of the slot are enqueued (`batch_to_device`)."""

    ring_guard: SlotGuard


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

    def _guard(self, b: int) -> SlotGuard:
        return self.loader.guards[b % self.loader.depth]

    def _fill(self, guard: SlotGuard, idx: int, cbed: np.ndarray, target: np.ndarray) -> None:
        """Reader task: wait until the GPU has copied the slot's previous batch, then read into it."""
        guard.wait()
        self.loader.dataset.read_into(idx, cbed, target)

    def _submit(self) -> None:
        cbed, target = self._slot(self.submitted)
        guard = self._guard(self.submitted)
        executor = self.loader._executor
        self.pending.append([executor.submit(self._fill, guard, idx, cbed[i], target[i])
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
                    self._fill(self._guard(b), idx, cbed[i], target[i])
        except BaseException:
            self.close()
            raise
        self.delivered += 1
        return self._batch(b)

    def _batch(self, b: int) -> RingBatch:
        """The batch dict of `collate_samples` (same keys, dtypes and shapes) over the ring slot."""
        indices = self.batches[b]
        n = len(indices)
        cbed, target = self.loader.ring[b % self.loader.depth]
        batch = RingBatch({"cbed": cbed[:n], "target": target[:n], "index": torch.tensor(indices)})
        batch.ring_guard = self._guard(b)
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
