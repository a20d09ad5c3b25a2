"""When an iterative ptychographic reconstruction has converged, judged on the solver's own data
error only (py4DSTEM's normalised misfit of the measured diffraction amplitudes), never on the truth.

Rule (`ConvergenceRule`): after at least ``window`` iterations, stop at iteration n when the error
fell by less than ``rel_tol`` (relative) over the last ``window`` iterations,
``(E[n - window] - E[n]) / E[n - window] < rel_tol``, or after ``max_iterations``. The step size
follows py4DSTEM's advice for gradient descent (lower it when the error rises): it starts at
``step_size`` and halves whenever an iteration raises the error, down to ``min_step_size``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field


class ConvergenceRule(BaseModel):
    """The stop rule and step-size schedule (the ``evaluation.ptycho_convergence`` YAML section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(4, ge=1, description="iterations over which the relative error drop is measured")
    rel_tol: float = Field(0.02, gt=0.0, lt=1.0, description="stop when the error fell by less than this")
    max_iterations: int = Field(64, ge=1, description="cap on passes over every probe position")
    step_size: float = Field(0.5, gt=0.0, description="initial gradient step (py4DSTEM's default 0.5)")
    min_step_size: float = Field(0.05, gt=0.0, description="the halving stops here")

    def converged(self, errors: list[float]) -> bool:
        """True when the error history (one value per iteration) meets the plateau criterion."""
        if len(errors) <= self.window:
            return False
        before, now = errors[-1 - self.window], errors[-1]
        return before <= 0 or (before - now) / before < self.rel_tol


@dataclass
class ConvergenceLog:
    """What the solver did: iterations run, the error after each, the final step size, whether it
    stopped on the plateau criterion (False: on the cap)."""

    errors: list[float] = field(default_factory=list)
    step_size: float = 0.5
    converged: bool = False

    @property
    def iterations(self) -> int:
        return len(self.errors)


def iterate(solver: Any, rule: ConvergenceRule, after_iteration: Callable[[Any], None] | None = None,
            **reconstruct_kwargs: Any) -> ConvergenceLog:
    """Run ``solver.reconstruct`` one iteration at a time (continuing the same reconstruction) until
    ``rule`` says converged or ``rule.max_iterations``; ``reconstruct_kwargs`` go to every call;
    ``after_iteration(solver)`` runs after each (e.g. a prior's proximal step on the object)."""
    log = ConvergenceLog(step_size=rule.step_size)
    while log.iterations < rule.max_iterations:
        solver.reconstruct(num_iter=1, step_size=log.step_size, reset=log.iterations == 0, progress_bar=False,
                           **reconstruct_kwargs)
        if after_iteration is not None:
            after_iteration(solver)
        log.errors.append(float(solver.error))
        if len(log.errors) > 1 and log.errors[-1] > log.errors[-2]:
            # A rising data error means the step overshoots: halve it (py4DSTEM's advice), data only.
            log.step_size = max(rule.min_step_size, log.step_size / 2)
        if rule.converged(log.errors):
            log.converged = True
            break
    return log


__all__ = ["ConvergenceRule", "ConvergenceLog", "iterate"]
