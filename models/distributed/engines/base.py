"""The engine interface every gradient-reduction strategy implements, and the world-size-1 no-op."""
from __future__ import annotations

import time

import torch
from torch import nn

from models.distributed.config import DistributedConfig
from models.distributed.instrument import StepRecorder
from models.distributed.launch import DistContext


class Engine:
    """Wraps a model for data-parallel training.

    Call forward on ``.module``, then ``loss.backward()``, then ``.synchronize()``: afterwards each
    parameter's ``.grad`` holds the gradient averaged over all ranks. ``synchronize()`` returns
    False only on the first step with ``gradient_lag`` (no lagged gradient yet: grads are zero, skip
    the optimizer step). ``.stats()`` describes the last step (see ``models.distributed.instrument``).
    """

    name = "none"

    def __init__(self, cfg: DistributedConfig, model: nn.Module, ctx: DistContext):
        self.cfg, self.ctx, self.model = cfg, ctx, model
        self.module: nn.Module = model
        self.recorder = StepRecorder(ctx.rank, cfg.timeline)
        self._last: dict = {}
        self._t_exit = time.perf_counter()
        self._closed = False

    def params(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def synchronize(self) -> bool:
        """Average gradients across ranks into ``.grad`` (call once after each backward)."""
        t_enter = time.perf_counter()
        self.recorder.add(compute_s=t_enter - self._t_exit)
        self.recorder.event("compute", self._t_exit, t_enter, "compute")
        with self.recorder.span("wait", "synchronize"):
            apply = self._synchronize()
        self._last = {"engine": self.name, **self.recorder.finish_step()}
        self._t_exit = time.perf_counter()
        return apply

    def _synchronize(self) -> bool:
        return True

    def stats(self) -> dict:
        """Counters of the last step: compute/communication/coordination/wait seconds, collectives,
        coordination messages and cycles, bytes sent (payload handed to collectives)."""
        return dict(self._last)

    def close(self) -> None:
        """Stop background work and write the timeline, if one was asked for."""
        if not self._closed:
            self._closed = True
            self.recorder.close()


class NoopEngine(Engine):
    """No reduction: world size 1 (every engine becomes this) or ``engine='none'``."""

    name = "none"


class GradientLag:
    """Kurth et al. 2018 gradient lag for engines that reduce synchronously: hand out step t-1's
    reduced gradient at step t (step 0 gets zeros)."""

    def __init__(self) -> None:
        self._previous: list[torch.Tensor] | None = None

    def swap(self, params: list[nn.Parameter]) -> bool:
        current = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        previous, self._previous = self._previous, current
        for p, g in zip(params, previous or [torch.zeros_like(p) for p in params]):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        return previous is not None
