"""Run a function on N local ranks (gloo on 127.0.0.1) the way torchrun would, with a hard timeout.

Used by the tests, the benchmarks and the tuner. Each rank gets torchrun's variables (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so ``init_from_env`` sees a
real launch. A rank that does not finish within ``timeout_s`` fails the whole run instead of
blocking it; every child is killed before returning.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_with_parent(parent_pid: int) -> None:
    """Ranks must not outlive the process that launched them (e.g. a killed test run)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(70)


def _bind(rank: int, cores: list[int]) -> None:
    """Pin this rank (and every thread it starts later: gloo's, the parent-watch) to one core,
    round-robin: rank r -> cores[r % len(cores)], as ``srun --cpu-bind=cores`` or ``mpirun
    --bind-to core`` would. Ranks beyond the core count then share cores in a fixed pattern
    (ceil(P/cores) on the busiest core) instead of migrating wherever the scheduler puts them."""
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def _child(fn, rank: int, nprocs: int, port: int, env: dict, args: tuple, results, parent_pid: int,
           cores: list[int] | None) -> None:
    import threading

    if cores:
        _bind(rank, cores)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1"})
    os.environ.update(env.get(rank, {}) if all(isinstance(k, int) for k in env) else env)
    import torch

    torch.set_num_threads(1)  # ranks share the machine's cores
    try:
        out = fn(rank, *args)
        results.put((rank, "ok", out))
    except BaseException as exc:  # reported to the parent with the traceback
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def _context():
    """A forkserver that has imported torch once: every later rank is a cheap fork of a process
    that has run no torch thread pools (forking a process that has is unsafe with OpenMP)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # torch._dynamo: DDP imports it on construction (2-3 s each time otherwise).
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "numpy", "models.distributed"])
    return ctx


class RankFailure(RuntimeError):
    """A rank raised, or the run timed out; ``.results`` holds what each rank returned."""

    def __init__(self, message: str, results: dict):
        super().__init__(message)
        self.results = results


def run_local(fn: Callable[..., Any], nprocs: int, *args: Any, timeout_s: float = 120.0,
              env: dict | None = None, allow_failures: bool = False,
              bind_cores: bool = False) -> dict[int, tuple[str, Any]]:
    """Start ``fn(rank, *args)`` on ``nprocs`` spawned processes; return ``{rank: (status, value)}``.

    ``status`` is ``ok`` (value = return value), ``error`` (value = traceback text) or ``exit``
    (the process died without reporting; value = exit code). ``env``: extra variables for every
    rank, or ``{rank: {...}}`` per rank. Unless ``allow_failures``, any non-ok rank raises
    :class:`RankFailure`. ``bind_cores``: pin rank r to the r-th usable core, wrapping (see ``_bind``).
    """
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    cores = sorted(os.sched_getaffinity(0)) if bind_cores else None
    # Not daemonic: a rank may start its own workers (DataLoader); run_local kills leftovers itself.
    procs = [ctx.Process(target=_child, args=(fn, r, nprocs, port, env or {}, args, results, os.getpid(), cores))
             for r in range(nprocs)]
    for p in procs:
        p.start()
    out: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < nprocs and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                out[rank] = (status, value)
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    # Drain anything that arrived just before the last exit.
                    time.sleep(0.2)
                    while not results.empty():
                        rank, status, value = results.get()
                        out[rank] = (status, value)
                    break
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(2.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    for r, p in enumerate(procs):
        out.setdefault(r, ("exit", p.exitcode))
    bad = {r: v for r, v in out.items() if v[0] != "ok"}
    if bad and not allow_failures:
        detail = "; ".join(f"rank {r}: {s} {str(v)[-1500:]}" for r, (s, v) in sorted(bad.items()))
        raise RankFailure(f"{len(bad)} of {nprocs} ranks failed within {timeout_s:g}s: {detail}", out)
    return out
