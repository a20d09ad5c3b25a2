"""The multislice ptychography baseline (py4DSTEM, `namsa.ptychography.multislice`): its record and its
map, the slices' phases summed over the interaction constant (V*Angstrom) at the targets' resolution.
Minutes per sample, so it runs on a subset of thick samples (`thick_subset.ThickSubset`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from namsa.ptychography.convergence import ConvergenceRule
from namsa.ptychography.multislice import MultisliceSettings

from ..config import EvaluationConfig
from .cache import Baseline
from .maps import PY4DSTEM, at_target_resolution, solver_facts
from .record import Method
from .thick_subset import ThickSubset


def multislice_baseline(sample: Any, shape: Sequence[int], settings: MultisliceSettings) -> Baseline:
    """Multislice ptychography of ``sample`` on a ``shape`` grid: the slices' phases summed over the
    interaction constant (V*Angstrom) at the targets' resolution; the `ptycho.ptycho_baseline` facts
    plus ``n_slices`` and ``slice_thickness_A``."""
    from namsa.ptychography.multislice import multislice_from_sample

    result = multislice_from_sample(sample, settings, output_shape=tuple(shape))
    return at_target_resolution(result.potential, sample.meta), {
        **solver_facts(result), "n_slices": result.n_slices, "slice_thickness_A": result.slice_thickness_A}


def _run(cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...], network: dict[str, np.ndarray]) -> Baseline:
    return multislice_baseline(sample, shape, cfg.multislice_ptycho)


def _quick(cfg: EvaluationConfig) -> EvaluationConfig:
    """One sample, whatever its thickness, two iterations."""
    settings = MultisliceSettings(max_samples=1, min_thickness_A=0.0, convergence=ConvergenceRule(max_iterations=2))
    return cfg.model_copy(update={"multislice_ptycho": settings})


METHOD = Method(
    name="multislice_ptycho", label="multislice ptychography (py4DSTEM; thick subset only)",
    short_label="multislice ptychography", verdict_label="multislice ptychography baseline (on its subset of samples)",
    description="multislice ptychography through py4DSTEM, slices from the sample's thickness, the slices' phases "
                "summed over the interaction constant (V*Angstrom); minutes per sample, so run and scored on a "
                "subset of thick samples only",
    colour="tab:red", targets=("potential",), legacy_fitted=True, judged=True, dose_sweep=False, panel_order=3,
    switch="multislice_ptycho", timing="py4DSTEM's own compute time of that sample (the original one for a cached map)",
    requires=PY4DSTEM, runner=_run, settings=lambda cfg: cfg.multislice_ptycho,
    subset=lambda cfg: ThickSubset(cfg.multislice_ptycho), quick=_quick,
    fit_convention="multislice ptychography (py4DSTEM; n_slices of slice_thickness_A from the sample's "
                   "thickness), slices' phases summed / interaction constant (V*Angstrom) at the targets' "
                   "resolution, facts as ptycho_fit; computed on a subset only (subset says which), so its "
                   "aggregates' n is smaller",
    missing_note="multislice ptychography was not computed (evaluation.multislice_ptycho is off, or the target is "
                 "not the potential)")
