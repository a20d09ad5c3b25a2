"""Measurements on this machine: gloo allreduce time vs message size and rank count, and the
step time of an engine on a model (used by the perfmodel fit, the benchmark and the tuner)."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch
from torch import nn

from models.distributed.config import DistributedConfig
from models.distributed.spawn import run_local


def _time_allreduce(rank: int, sizes: list[float], repeats: int) -> list[float]:
    import torch.distributed as dist

    from models.distributed import init_from_env

    ctx = init_from_env(DistributedConfig(timeout_s=120))
    out = []
    for nbytes in sizes:
        buf = torch.ones(max(1, int(nbytes) // 4))
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            if i:  # the first call sets up the connections' buffers
                times.append(time.perf_counter() - start)
        # The minimum: other jobs share these cores and only ever add time.
        out.append(float(np.min(times)))
    ctx.close()
    return out


def measure_allreduce(sizes: list[float], ranks: list[int], repeats: int = 5,
                      bind_cores: bool = False) -> list[tuple[int, float, float]]:
    """``(ranks, nbytes, seconds)``: the slowest rank's fastest fp32 all_reduce time per size.
    ``bind_cores``: pin each rank to a core (``spawn.run_local``)."""
    samples = []
    for p in ranks:
        results = run_local(_time_allreduce, p, list(sizes), repeats, timeout_s=300, bind_cores=bind_cores)
        per_rank = np.array([v for _, (_, v) in sorted(results.items())])
        for nbytes, t in zip(sizes, per_rank.max(axis=0)):
            samples.append((p, float(nbytes), float(t)))
    return samples


def _time_steps(rank: int, cfg_dict: dict, model_factory: Callable[[], nn.Module], make_batch, steps: int,
                warmup: int) -> dict:
    from models.distributed import build_engine, init_from_env

    cfg = DistributedConfig(**cfg_dict)
    ctx = init_from_env(cfg)
    torch.manual_seed(0)
    model = model_factory()
    engine = build_engine(cfg, model, ctx)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    totals: dict[str, float] = {}
    step_times = []
    for step in range(warmup + steps):
        if step == warmup:
            ctx.barrier()
        start = time.perf_counter()
        x, y = make_batch(step, rank)
        opt.zero_grad()
        nn.functional.mse_loss(engine.module(x), y).backward()
        if engine.synchronize():
            opt.step()
        if step >= warmup:
            step_times.append(time.perf_counter() - start)
            for k, v in engine.stats().items():
                if isinstance(v, (int, float)) and k != "step":
                    totals[k] = totals.get(k, 0.0) + v
    ctx.barrier()
    engine.close()
    ctx.close()
    # The median step is robust to the other jobs that share these cores; the fastest step is the
    # closest to this machine's uncontended time (interference only ever adds time).
    return {"step_s": float(np.median(step_times)), "step_min_s": float(np.min(step_times)),
            **{k: v / steps for k, v in totals.items()},
            "grad_bytes": sum(p.numel() * 4 for p in model.parameters()), "notices": ctx.notices}


def measure_engine(cfg: DistributedConfig | dict, ranks: int, model_factory: Callable[[], nn.Module], make_batch,
                   steps: int = 5, warmup: int = 2, timeout_s: float = 300, bind_cores: bool = False) -> dict:
    """Median (``step_s``) and fastest (``step_min_s``) step time of the slowest rank, and mean
    engine counters of rank 0, over ``steps`` after ``warmup``. ``make_batch(step, rank) -> (x, y)``.
    ``bind_cores``: pin each rank to a core (``spawn.run_local``)."""
    raw = cfg.model_dump() if isinstance(cfg, DistributedConfig) else dict(cfg)
    results = run_local(_time_steps, ranks, raw, model_factory, make_batch, steps, warmup, timeout_s=timeout_s,
                        bind_cores=bind_cores)
    values = [v for _, (_, v) in sorted(results.items())]
    return {**values[0], "step_s": max(v["step_s"] for v in values), "step_min_s": max(v["step_min_s"] for v in values)}


class BenchNet(nn.Module):
    """A plain conv net with ``blocks()``: the stand-in for benchmarks when the project's model
    presets are not importable. ``width`` channels, ``depth`` 3x3 conv blocks, 2 input channels."""

    def __init__(self, width: int = 48, depth: int = 6):
        super().__init__()
        self.stem = nn.Conv2d(2, width, 3, padding=1)
        self.layers = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(depth))
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)

    def blocks(self) -> list[tuple[str, list[nn.Parameter]]]:
        return ([("stem", list(self.stem.parameters()))]
                + [(f"layer{i}", list(m.parameters())) for i, m in enumerate(self.layers)]
                + [("head", list(self.head.parameters()))])


class BenchProblem:
    """A picklable (model factory, batch maker) pair for spawned ranks: ``BenchProblem(width, depth,
    batch, px)`` builds a ``BenchNet`` and random (batch, 2, px, px) -> (batch, 1, px, px) data."""

    def __init__(self, width: int = 48, depth: int = 6, batch: int = 2, px: int = 16):
        self.width, self.depth, self.batch, self.px = width, depth, batch, px

    def model(self) -> nn.Module:
        return BenchNet(self.width, self.depth)

    def make_batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step * 1009 + rank)
        return (torch.randn(self.batch, 2, self.px, self.px, generator=g),
                torch.randn(self.batch, 1, self.px, self.px, generator=g))

    def to_json(self) -> dict:
        """Plain values that `problem_from_json` rebuilds this problem from (no pickle crosses processes)."""
        return {"kind": "bench", "width": self.width, "depth": self.depth, "batch": self.batch, "px": self.px}

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model().parameters())
        return f"BenchNet(width={self.width}, depth={self.depth}; {n:,} params), batch {self.batch} x 2 x {self.px}^2 per rank"


class PresetProblem(BenchProblem):
    """The project's FC-DenseNet preset (``tiny``/``small``/``paper``) on random (batch, S, px, px)
    inputs, S from the preset (1024 patterns for ``small``)."""

    def __init__(self, preset: str = "small", batch: int = 1, px: int = 32):
        from models import ModelConfig

        super().__init__(batch=batch, px=px)
        self.preset = preset
        self.channels = ModelConfig(preset=preset).architecture().in_channels  # once, not per (timed) batch

    def model(self) -> nn.Module:
        from models import ModelConfig, build_model

        return build_model(ModelConfig(preset=self.preset))

    def make_batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step * 1009 + rank)
        return (torch.randn(self.batch, self.channels, self.px, self.px, generator=g),
                torch.randn(self.batch, 1, self.px, self.px, generator=g))

    def to_json(self) -> dict:
        return {"kind": "preset", "preset": self.preset, "batch": self.batch, "px": self.px}

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model().parameters())
        return (f"FC-DenseNet '{self.preset}' preset ({n:,} params), batch {self.batch} x "
                f"{self.channels} x {self.px}^2 per rank")


def problem_from_json(spec: dict) -> BenchProblem:
    """The problem described by ``BenchProblem.to_json()``: only known kinds and integer/str fields."""
    kind = spec.get("kind")
    ints = {k: int(spec[k]) for k in ("width", "depth", "batch", "px") if k in spec}
    if kind == "bench":
        return BenchProblem(**ints)
    if kind == "preset":
        return PresetProblem(str(spec["preset"]), batch=ints["batch"], px=ints["px"])
    raise ValueError(f"unknown benchmark problem kind {kind!r}; expected 'bench' or 'preset'")
