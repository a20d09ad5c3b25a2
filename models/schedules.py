"""Learning-rate and Huber-delta schedules (Laanait et al. 2019), pure functions of the position.

Being pure functions of (step, epoch), they need no state of their own: a checkpoint's step and
epoch restore them exactly.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up from ``lr0`` to min(1, N * lr0) over ``warmup_steps`` for N workers, then a
    staircase: times ``decay_factor`` every ``decay_every`` steps (0 = no decay)."""

    lr0: float
    world_size: int = 1
    warmup_steps: int = 0
    decay_every: int = 0
    decay_factor: float = 1.0

    @property
    def peak(self) -> float:
        """Rate at the end of warm-up: the paper's linear scaling with workers, capped at 1."""
        return max(self.lr0, min(1.0, self.world_size * self.lr0))

    def __call__(self, step: int) -> float:
        """Rate used for optimiser step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return self.lr0 + (self.peak - self.lr0) * step / self.warmup_steps
        if self.decay_every <= 0:
            return self.peak
        return self.peak * self.decay_factor ** ((step - self.warmup_steps) // self.decay_every)


def huber_delta(epoch: int, delta0: float = 10.0, decay: float = 0.99) -> float:
    """Huber delta of ``epoch`` (0-based): delta0 * decay^epoch. The original code never decayed
    delta (FACTS.md); this is the paper's stated intent."""
    return float(delta0 * decay ** epoch)
