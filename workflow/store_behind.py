"""The store write of one sample on a thread of its own while the simulation loop goes on.

With samples prepared ahead (`namsa.pipelined`, a GPU worker) the thread driving the GPU also wrote each
sample into the store (float16 cast, statistics, LMDB commit: ~0.05 s of a study sample, against ~0.005 s
of GPU work), and the GPU idled meanwhile (benchmarks/bench_simulate.py --study-host). `WriteBehind`
runs sample n's `StoreWriter.put` on one store thread while the caller runs sample n + 1; most of a put
is numpy and LMDB work that releases the GIL. At most one put is in flight, so samples are stored in
their order; its outcome is settled (written, failed, or a store error raised) before the next put and
on leaving the loop.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from namsa.errors import RunError

from .runner_io import one_line


class WriteBehind:
    """``put(sample_id, sample)``: the previous put settled, this one started on the store thread (``behind``)
    or run at once (not ``behind``: the sequential loop of a CPU worker, whose run uses every core). A sample a
    put refuses (bad data) is recorded in ``summary.failed``; a store, disk or run failure (`stage.StoreError`,
    `RunError`) is raised from the next ``put`` or ``settle``."""

    def __init__(self, writer: Any, summary: Any, behind: bool):
        self._writer, self._summary = writer, summary
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="namsa-store") if behind else None
        self._pending: tuple[str, Future] | None = None

    def put(self, sample_id: str, sample: Any) -> None:
        self.settle()
        if self._pool is None:
            self._count(sample_id, lambda: self._writer.put(sample))
        else:
            self._pending = (sample_id, self._pool.submit(self._writer.put, sample))

    def settle(self) -> None:
        """Wait for the put in flight on the store thread, if any, and count it."""
        if self._pending is not None:
            (sample_id, future), self._pending = self._pending, None
            self._count(sample_id, future.result)

    def _count(self, sample_id: str, finish: Callable[[], Any]) -> None:
        """Run ``finish`` (a put, or waiting for one) and count the sample as written or failed."""
        import stage

        try:
            finish()
        except (stage.StoreError, RunError):
            raise
        except Exception as exc:  # this sample's data, not the store: the others go on
            self._summary.failed.append((sample_id, one_line(exc)))
        else:
            self._summary.written += 1

    def __enter__(self) -> "WriteBehind":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        """Settle the last put (its store error raised unless another error is already on its way), then
        stop the thread: the writer is closed only after every put has finished."""
        try:
            if exc_type is None:
                self.settle()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
