"""Shared pieces of the distributed tests: a small real conv net with blocks(), data, a
single-process reference, and the per-rank training function the spawned ranks run.

(No tests here; the name keeps it importable by spawned ranks next to the test modules.)
"""
from __future__ import annotations

import random
import time

import numpy as np
import torch
from torch import nn

from models.distributed import DistributedConfig, build_engine, init_from_env

BATCH = 8          # combined batch over all ranks
STEPS = 3
LR = 0.05


class TinyNet(nn.Module):
    """A 4-block conv net without batch norm or dropout, so data-parallel training on split batches
    is mathematically identical to single-process training on the combined batch."""

    def __init__(self, width: int = 6):
        super().__init__()
        self.stem = nn.Conv2d(2, width, 3, padding=1)
        self.body = nn.Sequential(nn.Tanh(), nn.Conv2d(width, width, 3, padding=1), nn.Tanh())
        self.mix = nn.Conv2d(width, width, 1)
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.body(self.stem(x)))))

    def blocks(self) -> list[tuple[str, list[nn.Parameter]]]:
        return [(n, list(m.parameters())) for n, m in
                (("stem", self.stem), ("body", self.body), ("mix", self.mix), ("head", self.head))]


def batch(step: int, channels: int = 2, px: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, channels, px, px, generator=g), torch.randn(BATCH, 1, px, px, generator=g)


def fresh_model(seed: int = 0, width: int = 6) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(width)


class Problem:
    """A model factory and combined batches (picklable, for spawned ranks)."""

    def model(self) -> nn.Module:
        return fresh_model()

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch(step)


class DenseNetProblem(Problem):
    """The project's FC-DenseNet (tiny preset, 4 input patterns of 16 px), without batch norm or
    dropout so split-batch training equals combined-batch training exactly."""

    def model(self) -> nn.Module:
        from models import ModelConfig, build_model

        torch.manual_seed(0)
        return build_model(ModelConfig(preset="tiny", in_channels=4, td_bn=False, dropout=0.0))

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch(step, channels=4, px=16)


TINY = Problem()


def flat_params(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def reference(steps: int = STEPS, lag: bool = False, problem: Problem = TINY) -> tuple[np.ndarray, np.ndarray]:
    """Single-process SGD on the combined batch; with ``lag`` step t applies step t-1's gradient
    (step 0 applies nothing). Returns (initial params, final params)."""
    model = problem.model()
    start = flat_params(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    previous = None
    for step in range(steps):
        x, y = problem.batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        if lag:
            grads, previous = previous, grads
            if grads is None:
                continue
            for p, g in zip(model.parameters(), grads):
                p.grad.copy_(g)
        opt.step()
    return start, flat_params(model)


def train_one(cfg: DistributedConfig, ctx, rank: int, world: int, steps: int = STEPS,
              shuffled_backward: bool = False, engine_factory=None, problem: Problem = TINY) -> dict:
    """Train a fresh model for ``steps`` on this rank's share of each combined batch."""
    model = problem.model()
    engine = engine_factory(cfg, model, ctx) if engine_factory else build_engine(cfg, model, ctx)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rng = random.Random(rank * 7919 + 1)
    per = BATCH // world
    stats = []
    for step in range(steps):
        x, y = problem.batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = nn.functional.mse_loss(engine.module(x), y)
        if shuffled_backward:
            # Force a different, random group-readiness order on every rank: backward one group
            # at a time (each fires its parameters' hooks), with random pauses between groups.
            groups = list(engine.groups)
            rng.shuffle(groups)
            for g in groups:
                time.sleep(rng.uniform(0, 0.02))
                loss.backward(inputs=g.params, retain_graph=True)
        else:
            loss.backward()
        if engine.synchronize():
            opt.step()
        stats.append(engine.stats())
    engine.close()
    return {"params": flat_params(model), "stats": stats}


def run_configs(rank: int, cfgs: list[dict], base: dict | None = None, shuffled: bool = False,
                problem: Problem = TINY) -> dict:
    """Spawned-rank entry: join the job, train once per config, return params, stats and notices."""
    ctx = init_from_env(DistributedConfig(**(base or {"timeout_s": 60})))
    out = {}
    for raw in cfgs:
        cfg = DistributedConfig(**{**(base or {"timeout_s": 60}), **raw})
        out[repr(sorted(raw.items()))] = train_one(cfg, ctx, rank, ctx.world_size, shuffled_backward=shuffled,
                                                   problem=problem)
    out["_ctx"] = {"world": ctx.world_size, "local_size": ctx.local_size, "node_rank": ctx.node_rank,
                   "local_rank": ctx.local_rank, "notices": list(ctx.notices), "backend": ctx.backend}
    ctx.close()
    return out


def key(raw: dict) -> str:
    return repr(sorted(raw.items()))


def relative_error(params: np.ndarray, ref: np.ndarray, start: np.ndarray) -> float:
    """||params - ref|| relative to how far the reference moved."""
    return float(np.linalg.norm(params - ref) / np.linalg.norm(ref - start))
