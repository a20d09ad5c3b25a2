"""Samples simulated in order while a few host threads prepare the next ones.

On a GPU the host work of a sample (structure, supercell, phonon configurations, potential and
transmission functions, rebinner, targets: :func:`namsa.simulate.prepare_sample`) would leave the
device idle between samples. :func:`prepared_in_order` runs that host phase of samples n + 1 ..
n + k in a pool of k = ``cfg.host_threads`` threads while the caller runs sample n
(:func:`namsa.simulate.run_prepared`), and hands the samples back in their order. The samples are
the ones :func:`namsa.simulate.simulate_sample` gives, bit for bit: every sample draws from its own
seed, so which thread prepares it changes nothing.

On CPU with ``host_threads`` = 1 nothing runs ahead (the run already uses every core): the host
phase is run inline when the caller asks for it, exactly the sequential order.
"""
from __future__ import annotations

import contextlib
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

from .backend import single_threaded_blas
from .config import SimulationConfig
from .sample import Sample
from .simulate import PreparedSample, prepare_sample, run_prepared

#: one sample's inputs: (what namsa.load_structure loads, zone axis, variant)
Job = tuple[Any, Sequence[int], int]


def lookahead_threads(cfg: SimulationConfig) -> int:
    """Host threads preparing ahead: ``cfg.host_threads`` on a GPU, none on CPU at the default 1."""
    if cfg.device == "cpu" and cfg.host_threads == 1:
        return 0
    return cfg.host_threads


class PreparedSlot:
    """One job's host phase: already running in the pool (a Future), or run inline on first ask."""

    def __init__(self, job: Job, cfg: SimulationConfig, future: Future | None, pool: ThreadPoolExecutor | None):
        self.job, self._cfg, self._future, self._pool = job, cfg, future, pool

    @property
    def ahead(self) -> bool:
        """Whether its host phase was started in the pool ahead of its turn."""
        return self._future is not None

    def prepared(self) -> PreparedSample:
        """The prepared sample; raises what its preparation raised."""
        if self._future is not None:
            return self._future.result()
        return prepare_sample(*self.job[:2], self._cfg, self.job[2])

    def sample(self) -> Sample:
        """The finished sample: the device phase run here, in the caller's thread (next configurations
        of a frozen-phonon sample are prepared in the pool meanwhile)."""
        return run_prepared(self.prepared(), self._cfg, self._pool)

    def discard(self) -> None:
        """Not needed after all (stored or claimed elsewhere): cancel it if it has not started."""
        if self._future is not None:
            self._future.cancel()


def prepared_in_order(jobs: Sequence[Job], cfg: SimulationConfig,
                      wanted: Callable[[int], bool] = lambda i: True) -> Iterator[PreparedSlot]:
    """A :class:`PreparedSlot` per job, in order, with the host phase of the next ``host_threads``
    wanted jobs already running in a pool (``wanted(i)`` False: job i is not prepared ahead, e.g.
    already stored). Leaving the loop early cancels what has not started and waits for the rest."""
    threads = lookahead_threads(cfg)
    if threads == 0:
        for job in jobs:
            yield PreparedSlot(job, cfg, None, None)
        return
    # BLAS on one thread for the whole loop: the device path builds its potential on the host too, and
    # a structure-factor GEMM on 2 OpenBLAS threads changes its last bits (namsa.backend._SharedBlasLimit)
    blas = single_threaded_blas()
    with blas, short_gil_switch(), ThreadPoolExecutor(max_workers=threads, thread_name_prefix="namsa-prepare") as pool:
        futures: dict[int, Future] = {}
        ahead = iter(i for i in range(len(jobs)) if wanted(i))
        try:
            for i, job in enumerate(jobs):
                _fill(futures, ahead, jobs, cfg, pool, i, threads)
                yield PreparedSlot(job, cfg, futures.pop(i, None), pool)
        finally:
            for future in futures.values():
                future.cancel()


#: GIL switch interval while host threads run ahead (Python's default is 5 ms): the thread driving
#: the device takes the GIL back after each device sync, and with a pool thread in pure Python it
#: would otherwise wait up to 5 ms for it, a tenth of a gpu-node sample's device time
GIL_SWITCH_S = 0.0005


@contextlib.contextmanager
def short_gil_switch(seconds: float = GIL_SWITCH_S) -> Iterator[None]:
    """``sys.setswitchinterval(seconds)`` for the block, the previous interval restored after."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _fill(futures: dict[int, Future], ahead: Iterator[int], jobs: Sequence[Job], cfg: SimulationConfig,
          pool: ThreadPoolExecutor, current: int, threads: int) -> None:
    """Submit wanted jobs until the current one and the next ``threads`` are in flight."""
    while len([i for i in futures if i > current]) < threads:
        index = next(ahead, None)
        if index is None:
            return
        source, axis, variant = jobs[index]
        futures[index] = pool.submit(prepare_sample, source, axis, cfg, variant)
