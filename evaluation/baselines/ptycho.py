"""The single-slice ptychography baseline (py4DSTEM, `namsa.ptychography.single_slice`): its record and
its map, the phase over the interaction constant (V*Angstrom) at the targets' resolution."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from namsa.ptychography.convergence import ConvergenceRule

from ..config import EvaluationConfig
from .cache import Baseline
from .maps import PY4DSTEM, at_target_resolution, solver_facts
from .record import Method


def ptycho_baseline(sample: Any, shape: Sequence[int], iterations: int | None, batch_size: int,
                    convergence: ConvergenceRule | None = None) -> Baseline:
    """Single-slice ptychography of ``sample`` on a ``shape`` grid: its phase over the interaction
    constant (V*Angstrom) at the targets' resolution (`maps.at_target_resolution`).

    iterations: a fixed count, or None to iterate until ``convergence`` (on the data error only).
    Returns the map and ``{"seconds", "error", "iterations", "converged"}``: py4DSTEM's compute time for
    this sample (s), its final data error, the iterations run and whether the stop rule (not the cap)
    ended them.
    """
    from namsa.ptychography.single_slice import ptycho_from_sample

    result = ptycho_from_sample(sample, output_shape=tuple(shape), iterations=iterations, batch_size=batch_size,
                                convergence=convergence)
    return at_target_resolution(result.potential, sample.meta), solver_facts(result)


def _run(cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...], network: dict[str, np.ndarray]) -> Baseline:
    return ptycho_baseline(sample, shape, cfg.ptycho_iterations, cfg.ptycho_batch_size, cfg.ptycho_convergence)


METHOD = Method(
    name="ptycho", label="ptychography (py4DSTEM)", short_label="ptychography", verdict_label="ptychography baseline",
    description="single-slice ptychography of the same stack through py4DSTEM, iterated until its own data error "
                "stops falling: the phase over the interaction constant (V*Angstrom) at the targets' resolution",
    colour="tab:green", targets=("potential",), legacy_fitted=True, judged=True, dose_sweep=False, panel_order=2,
    switch="ptycho", timing="py4DSTEM's own compute time of that sample (the original one for a cached map)",
    requires=PY4DSTEM, runner=_run,
    settings=lambda cfg: (cfg.ptycho_iterations, cfg.ptycho_batch_size, cfg.ptycho_convergence),
    quick=lambda cfg: cfg.model_copy(update={"ptycho": True, "ptycho_iterations": 2}),
    fit_convention="single-slice ptychography (py4DSTEM) phase / interaction constant (V*Angstrom) at the "
                   "targets' resolution; seconds, error, iterations run and converged (stopped by the "
                   "data-error rule, not the cap)",
    missing_note="ptychography was not computed (evaluation.ptycho is off, or the target is not the potential)")
