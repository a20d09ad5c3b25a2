"""``network+ptycho``: the network's potential refined by ptychography started from it
(`namsa.ptychography.refine`), for the evaluation: its record and its map. The refinement reads the
sample's CBED stack and calibrations only; the network's map is kept where refining raised the
solver's data error."""
from __future__ import annotations

from typing import Any

import numpy as np

from namsa.ptychography.convergence import ConvergenceRule
from namsa.ptychography.refine import RefineSettings, refine_from_sample

from ..config import EvaluationConfig
from .cache import Baseline
from .maps import PY4DSTEM, at_target_resolution
from .record import Method


def refined_from_network(settings: RefineSettings, sample: Any,
                         network_potential: np.ndarray) -> Baseline:
    """(raw map, record) of ``network_potential`` (T, T, V * Angstrom, the network's prediction for
    ``sample``) refined by ptychography of ``sample.cbed``.

    The map is in V * Angstrom on the network's grid at the targets' resolution: a refined map
    (ptychography resolves finer than the targets) is convolved with the targets' Gaussian
    (``meta.target_fwhm_A``, `maps.at_target_resolution`), as the ptychography baselines are; the
    network's own map, when kept, is already at that resolution and returned as is. Its mean is the
    network's (a uniform phase is invisible to the data). The record holds ``seconds``, ``start_error``,
    ``final_error``, ``error`` (the data error of the map returned), ``iterations``, ``converged``,
    ``kept_network``, ``n_slices`` and ``skipped`` (why it was not refined: too thick, or too strong a
    phase). The truth is never read.
    """
    result = refine_from_sample(sample, network_potential, settings)
    raw = result.potential if result.kept_network else at_target_resolution(result.potential, sample.meta)
    record = result.record()
    del record["errors"]   # the per-iteration history: too long for every sample's record
    record["error"] = result.start_error if result.kept_network else result.final_error
    return np.asarray(raw, dtype=np.float32), record


def _run(cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...], network: dict[str, np.ndarray]) -> Baseline:
    return refined_from_network(cfg.network_ptycho, sample, network["potential"])


def _quick(cfg: EvaluationConfig) -> EvaluationConfig:
    """Two iterations."""
    return cfg.model_copy(update={"network_ptycho": RefineSettings(convergence=ConvergenceRule(max_iterations=2))})


# Not cached: its map depends on the model. Not legacy-fitted: it postdates the legacy rule. Not judged:
# the verdict is the network against what microscopists have; this is ours, shown beside it.
METHOD = Method(
    name="network+ptycho", label="network refined by ptychography (py4DSTEM, started from the network's map)",
    short_label="network+ptycho", verdict_label="network refined by ptychography",
    description="the network's potential refined by ptychography (py4DSTEM) of the same stack, started from it; "
                "thin, weak-phase specimens only, and the network's map kept where refining raised the solver's "
                "data error",
    colour="tab:purple", targets=("potential",), legacy_fitted=False, judged=False, dose_sweep=False,
    panel_order=5, switch="network_ptycho", timing="py4DSTEM's own compute time of that sample's refinement",
    requires=PY4DSTEM, runner=_run, quick=_quick,
    missing_note="network+ptycho was not computed (evaluation.network_ptycho is off, or the target is not "
                 "the potential)")

__all__ = ["METHOD", "refined_from_network"]
