"""Mixed precision: bf16 / fp16 autocast and dynamic loss scaling for fp16 (fp32 master weights).

Loss scaling (Micikevicius et al. 2018, as in Laanait et al. 2019): the loss is multiplied by the
scale before backward and the gradients divided by it afterwards; a step whose gradients hold
Inf/NaN is skipped and counted and the scale halved (never below ``floor``); after
``growth_interval`` clean steps in a row the scale doubles. Parameters stay float32 throughout.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context for ``precision`` (fp32: no autocast)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def grads_finite(params: Iterable[torch.Tensor]) -> bool:
    """True when every gradient is finite (one host sync for all of them)."""
    flags = [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True


class LossScaler:
    """Dynamic loss scale; ``enabled=False`` (fp32, bf16) keeps scale 1 but still detects Inf/NaN."""

    def __init__(self, enabled: bool, init_scale: float = 2.0 ** 16, floor: float = 1.0,
                 growth_interval: int = 2000, backoff: float = 0.5, growth: float = 2.0):
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.floor = float(floor)
        self.growth_interval = int(growth_interval)
        self.backoff, self.growth = float(backoff), float(growth)
        self.clean_steps = 0
        self.overflow_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, params: Iterable[torch.Tensor]) -> None:
        """Divide gradients by the scale, in place (fp32 gradients of fp32 master weights)."""
        if not self.enabled or self.scale == 1.0:
            return
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is not None:
                p.grad.mul_(inv)

    def update(self, finite: bool) -> bool:
        """Record a step's outcome; return True when the step may be applied."""
        if not finite:
            self.overflow_steps += 1
            self.clean_steps = 0
            if self.enabled:
                self.scale = max(self.scale * self.backoff, self.floor)
            return False
        self.clean_steps += 1
        if self.enabled and self.clean_steps >= self.growth_interval:
            self.scale *= self.growth
            self.clean_steps = 0
        return True

    @property
    def at_floor(self) -> bool:
        return not self.enabled or self.scale <= self.floor

    def state_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "scale": self.scale, "floor": self.floor,
                "clean_steps": self.clean_steps, "overflow_steps": self.overflow_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.overflow_steps = int(state["overflow_steps"])
