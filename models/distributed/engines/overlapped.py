"""Engines that reduce gradient groups on a background thread while backward is still running.

Per-parameter post-accumulate-grad hooks count down each group; when a group is complete on this
rank its gradients are flattened into a buffer (so the next step may reuse ``.grad``). A worker
thread, which owns a private process group so it never interleaves with the trainer's own
collectives, then decides *when* a group is reduced:

* ``grouped``: immediately, in this rank's readiness order (like DDP, every rank must produce
  gradients in the same order).
* ``bitvector``: the paper's coordination. Each cycle (every ``cycle_time_ms`` or as soon as a group
  becomes ready) every rank sets the bits of its ready, unreduced groups in a bit vector whose
  positions come from a cache shared by all ranks; one all_reduce with bitwise AND yields the groups
  ready everywhere, which are fused and reduced in cache order. All ranks see the same result, so
  they run the same cycles and reductions whatever order their groups became ready in: no deadlock.
* ``master_worker``: Horovod's original coordinator. Each cycle rank 0 gathers every rank's
  readiness and broadcasts the groups ready everywhere (2(P-1) messages through rank 0 per cycle).
* ``hierarchical``: grouped scheduling with Kurth et al.'s node-aware reduction.
"""
from __future__ import annotations

import abc
import queue
import threading

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from models.distributed.config import DistributedConfig
from models.distributed.engines.base import Engine
from models.distributed.engines.grouping import Group, make_groups
from models.distributed.engines.reducers import FlatReducer, HierarchicalReducer, probe_collective
from models.distributed.errors import DistributedConfigError, PeerFailureError
from models.distributed.launch import DistContext


class _Step:
    """Readiness and results of one step's groups (shared by the hook thread and the worker)."""

    def __init__(self, groups: list[Group]):
        self.cond = threading.Condition()
        self.remaining = [len(g.params) for g in groups]
        self.flat: list[torch.Tensor | None] = [None] * len(groups)
        self.ready_order: list[int] = []
        self.result: list[torch.Tensor | None] = [None] * len(groups)
        self.done = threading.Event()
        self.error: BaseException | None = None

    def mark_ready(self, index: int, flat: torch.Tensor) -> None:
        with self.cond:
            self.flat[index] = flat
            self.ready_order.append(index)
            self.cond.notify_all()


class OverlappedEngine(Engine):
    """Base of grouped / bitvector / master_worker / hierarchical (see the module docstring)."""

    name = "grouped"

    def __init__(self, cfg: DistributedConfig, model: nn.Module, ctx: DistContext, groups: list[Group] | None = None):
        super().__init__(cfg, model, ctx)
        self.groups = groups if groups is not None else make_groups(model, cfg)
        self._group_of = {id(p): i for i, g in enumerate(self.groups) for p in g.params}
        # A private group: the worker thread's collectives never interleave with the trainer's.
        self.pg = dist.new_group(backend=ctx.backend if ctx.backend in ("gloo", "nccl") else None)
        self.reducer = self._make_reducer()
        self._lock = threading.Lock()
        self._step: _Step | None = None
        self._in_flight: _Step | None = None  # gradient lag: last step's reduction, still running
        self._lag_started = False
        self._broken: BaseException | None = None
        self._queue: queue.Queue[_Step | None] = queue.Queue()
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for g in self.groups for p in g.params]
        self._thread = threading.Thread(target=self._work, name=f"{self.name}-reduce", daemon=True)
        self._thread.start()

    def _make_reducer(self):
        return FlatReducer(self.cfg, self.ctx, self.pg, self.recorder)

    # ---- hook side (autograd thread) ----
    def _current(self) -> _Step:
        with self._lock:
            if self._step is None:
                self._step = _Step(self.groups)
                self._queue.put(self._step)
            return self._step

    def _flatten(self, index: int) -> torch.Tensor:
        params = self.groups[index].params
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                          for p in params])

    def _on_grad(self, param: nn.Parameter) -> None:
        index = self._group_of[id(param)]
        step = self._current()
        with step.cond:
            step.remaining[index] -= 1
            complete = step.remaining[index] == 0
            if step.remaining[index] < 0:
                raise DistributedConfigError(
                    f"{self.name} engine: a gradient of group '{self.groups[index].name}' was accumulated twice "
                    "before synchronize(); gradient accumulation over several backward() calls is not "
                    "supported: call engine.synchronize() after every backward()")
        if complete:
            step.mark_ready(index, self._flatten(index))

    # ---- trainer side ----
    def _synchronize(self) -> bool:
        step = self._current()
        with self._lock:
            self._step = None
        for i in range(len(self.groups)):
            # Groups whose parameters got no gradient this step (unused): zeros, like DDP's static graph.
            if step.flat[i] is None:
                step.mark_ready(i, self._flatten(i))
        if not self.cfg.gradient_lag:
            self._apply(self._wait(step))
            return True
        previous, self._in_flight = self._in_flight, step
        if previous is None and not self._lag_started:
            self._lag_started = True
            for p in self.params():
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()
            return False
        self._apply(self._wait(previous))
        return True

    def _wait(self, step: _Step) -> _Step:
        if not step.done.wait(self.cfg.timeout_s + 5.0):
            raise PeerFailureError(
                f"rank {self.ctx.rank}: gradient reduction did not finish within distributed.timeout_s="
                f"{self.cfg.timeout_s:g}s: another rank died or hung; restart the job with --resume")
        if step.error is not None:
            err = step.error
            raise PeerFailureError(
                f"rank {self.ctx.rank}: gradient reduction failed ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[0][:160] if str(err).strip() else ''}): another rank died "
                "or lost its connection; restart the job with --resume") from err
        return step

    def _apply(self, step: _Step) -> None:
        for group, flat in zip(self.groups, step.result):
            offset = 0
            for p in group.params:
                view = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
                offset += p.numel()
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)

    # ---- worker thread ----
    def _work(self) -> None:
        while True:
            step = self._queue.get()
            if step is None:
                return
            try:
                if self._broken is not None:
                    raise self._broken
                self._schedule(step)
            except BaseException as exc:  # reported to the trainer by synchronize()
                step.error = exc
                self._broken = exc
            finally:
                step.done.set()

    def _wait_ready(self, step: _Step, seen: int, timeout: float | None) -> int:
        """Block until more than ``seen`` groups are ready (or ``timeout``); return the ready count."""
        with step.cond:
            step.cond.wait_for(lambda: len(step.ready_order) > seen or self._closed, timeout=timeout)
            if self._closed and len(step.ready_order) <= seen and timeout is None:
                raise RuntimeError("engine closed during a step")
            return len(step.ready_order)

    def _reduce(self, step: _Step, indices: list[int]) -> None:
        name = "+".join(self.groups[i].name for i in indices)
        with self.recorder.span("communication", name):
            out = self.reducer.allreduce_mean([step.flat[i] for i in indices], indices)
        for i, flat in zip(indices, out):
            step.result[i] = flat

    def _schedule(self, step: _Step) -> None:
        for k in range(len(self.groups)):
            self._wait_ready(step, k, None)
            self._reduce(step, [step.ready_order[k]])

    def close(self) -> None:
        if self._closed:
            return
        if self._in_flight is not None:
            self._in_flight.done.wait(self.cfg.timeout_s)
        super().close()
        self._queue.put(None)
        if self._step is not None:  # wake a worker waiting for a step that will never complete
            with self._step.cond:
                self._step.cond.notify_all()
        self._thread.join(timeout=5.0)
        for hook in self._hooks:
            hook.remove()


class GroupedEngine(OverlappedEngine):
    name = "grouped"


class _CoordinatedEngine(OverlappedEngine, abc.ABC):
    """Cycles of readiness agreement, then reduction of the agreed groups in cache order."""

    def __init__(self, cfg: DistributedConfig, model: nn.Module, ctx: DistContext, groups: list[Group] | None = None):
        super().__init__(cfg, model, ctx, groups)
        # Readiness agreement runs over a gloo (CPU) group of its own, whatever carries the gradients:
        # under NCCL a device flag tensor would need an H2D copy, a collective on the default stream
        # and a blocking .cpu() every cycle, so each cycle would wait for the backward pass to drain.
        self.coord_pg = dist.new_group(backend="gloo")
        # The response cache: group -> bit position, identical on every rank (groups are checked
        # to be identical at start-up), in backward order.
        self.cache = {g.name: bit for bit, g in enumerate(self.groups)}
        self._fusion_bytes = max(1, int(cfg.fusion_threshold_mb * 2**20))

    @abc.abstractmethod
    def _agree(self, pending: np.ndarray) -> np.ndarray:
        """Given this rank's ready-and-unreduced flags, return the groups ready on every rank."""

    def _schedule(self, step: _Step) -> None:
        n = len(self.groups)
        done = np.zeros(n, dtype=bool)
        seen = 0
        cycle_s = self.cfg.cycle_time_ms / 1000.0
        while not done.all():
            seen = self._wait_ready(step, seen, cycle_s)
            with step.cond:
                local = np.array([f is not None for f in step.flat])
            with self.recorder.span("coordination", "cycle", coordination_cycles=1):
                agreed = self._agree(local & ~done) & ~done
            batch: list[int] = []
            size = 0
            for i in sorted(np.flatnonzero(agreed), key=lambda i: self.cache[self.groups[i].name]):
                # Fuse agreed groups into one collective up to the fusion threshold.
                if batch and size + self.groups[i].nbytes > self._fusion_bytes:
                    self._reduce(step, batch)
                    batch, size = [], 0
                batch.append(int(i))
                size += self.groups[i].nbytes
            if batch:
                self._reduce(step, batch)
            done |= agreed


class BitvectorEngine(_CoordinatedEngine):
    name = "bitvector"

    def __init__(self, cfg: DistributedConfig, model: nn.Module, ctx: DistContext, groups: list[Group] | None = None,
                 force_min: bool = False):
        super().__init__(cfg, model, ctx, groups)
        why = "forced" if force_min else probe_collective(
            lambda: dist.all_reduce(torch.zeros(1, dtype=torch.int64), op=dist.ReduceOp.BAND, group=self.coord_pg))
        self.use_band = why is None
        if why:
            ctx.notice(f"backend {ctx.backend} lacks ReduceOp.BAND on int64 ({why}); bitvector "
                       "coordination falls back to all_reduce MIN over one int32 flag per group")

    def _agree(self, pending: np.ndarray) -> np.ndarray:
        n = len(pending)
        if self.use_band:
            packed = np.packbits(pending.astype(np.uint8), bitorder="little")
            words = np.zeros(8 * ((len(packed) + 7) // 8), dtype=np.uint8)
            words[: len(packed)] = packed
            bits = torch.from_numpy(words.view(np.int64).copy())
            dist.all_reduce(bits, op=dist.ReduceOp.BAND, group=self.coord_pg)
            self.recorder.add(collectives=1, coordination_messages=1, bytes_sent=bits.numel() * 8)
            return np.unpackbits(bits.cpu().numpy().view(np.uint8), bitorder="little")[:n].astype(bool)
        flags = torch.from_numpy(pending.astype(np.int32))
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.coord_pg)
        self.recorder.add(collectives=1, coordination_messages=1, bytes_sent=flags.numel() * 4)
        return flags.cpu().numpy().astype(bool)


class MasterWorkerEngine(_CoordinatedEngine):
    name = "master_worker"

    def _agree(self, pending: np.ndarray) -> np.ndarray:
        size = self.ctx.world_size
        request = torch.from_numpy(pending.astype(np.uint8))
        root = dist.get_global_rank(self.coord_pg, 0)
        inbox = [torch.empty_like(request) for _ in range(size)] if self.ctx.rank == root else None
        dist.gather(request, inbox, dst=root, group=self.coord_pg)
        response = torch.stack(inbox).amin(dim=0) if inbox is not None else torch.empty_like(request)
        dist.broadcast(response, src=root, group=self.coord_pg)
        messages = 2 * (size - 1) if self.ctx.rank == root else 2
        self.recorder.add(collectives=2, coordination_messages=messages, bytes_sent=request.numel())
        return response.cpu().numpy().astype(bool)


class HierarchicalEngine(OverlappedEngine):
    """Grouped scheduling; each group reduced node-aware (see ``HierarchicalReducer``)."""

    name = "hierarchical"

    def _make_reducer(self):
        ctx = self.ctx
        if ctx.world_size % ctx.local_size:
            ctx.notice(f"world size {ctx.world_size} is not a multiple of the node size {ctx.local_size}; "
                       "hierarchical engine uses a flat all_reduce")
            return FlatReducer(self.cfg, ctx, self.pg, self.recorder)
        from models.distributed.launch import all_gather_objects

        layout = all_gather_objects(ctx, (ctx.node_rank, ctx.local_rank))
        nodes = sorted({node for node, _ in layout})
        intra = cross = None
        # new_group is collective: every rank creates every subgroup, in the same order.
        for node in nodes:
            g = dist.new_group([r for r, (n, _) in enumerate(layout) if n == node], backend=ctx.backend)
            if node == ctx.node_rank:
                intra = g
        for i in range(ctx.local_size):
            g = dist.new_group([r for r, (_, lr) in enumerate(layout) if lr == i], backend=ctx.backend)
            if i == ctx.local_rank:
                cross = g
        return HierarchicalReducer(self.cfg, ctx, intra, cross, self.recorder)
