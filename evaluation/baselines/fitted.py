"""The iCoM, single-slice and multislice ptychography baselines put into the truth's units: a per-sample least-squares
fit of ``scale * map + offset`` to the truth with ``scale >= 0`` (uses the truth for these two
scalars only; a sign flip is not allowed, and the unconstrained, signed scale is recorded beside
the fit so that a reader sees where the baseline's map was anti-correlated with the truth)."""
from __future__ import annotations

from typing import Any

import numpy as np

from namsa.targets import to_target_resolution

from ..metrics import fit_affine_nonnegative
from namsa.ptychography.convergence import ConvergenceRule
from .icom import icom_from_sample
from namsa.ptychography.multislice import MultisliceSettings


def fit_to_truth(raw: np.ndarray, truth: np.ndarray, meta: dict[str, Any] | None = None
                 ) -> tuple[np.ndarray, dict[str, float]]:
    """``scale * raw + offset`` with the non-negative least-squares scale, and
    ``{"scale", "offset", "signed_scale"}``. A map whose best fit would need a negative scale gets
    scale 0: the best constant map (the truth's mean). With the sample's ``meta``, ``raw`` is first
    brought to the targets' resolution (``target_fwhm_A``, `namsa.targets.to_target_resolution`),
    as the network learned it: ptychography, whose maps resolve finer than the probe, is not charged
    for detail finer than the truth holds."""
    if meta is not None and meta.get("target_fwhm_A"):
        raw = to_target_resolution(raw, meta["fov_A"], float(meta["target_fwhm_A"]))
    scale, offset, signed = fit_affine_nonnegative(raw, truth)
    fitted = (scale * np.asarray(raw, dtype=np.float64) + offset).astype(np.float32)
    return fitted, {"scale": scale, "offset": offset, "signed_scale": signed}


def icom_baseline(sample: Any, truth: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """iCoM of ``sample`` on the truth's grid, fitted to ``truth`` (`fit_to_truth`).

    Returns the fitted map (units of the truth) and ``{"scale", "offset", "signed_scale"}``.
    """
    # Not smoothed to the targets' resolution: iCoM is already blurred by the probe (its resolution is
    # the incoherent probe's, about the targets'), and a second blur measurably lowers its score.
    return fit_to_truth(icom_from_sample(sample, output_shape=truth.shape), truth)


def ptycho_baseline(sample: Any, truth: np.ndarray, iterations: int | None, batch_size: int,
                    convergence: ConvergenceRule | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Single-slice ptychography of ``sample`` on the truth's grid, fitted to ``truth`` (`fit_to_truth`).

    iterations: a fixed count, or None to iterate until ``convergence`` (on the data error only).
    Returns the fitted map (units of the truth) and ``{"scale", "offset", "signed_scale", "seconds",
    "error", "iterations", "converged"}``: the fit, py4DSTEM's compute time for this sample (s), its
    final data error, the iterations run and whether the stop rule (not the cap) ended them.
    """
    from namsa.ptychography.single_slice import ptycho_from_sample

    result = ptycho_from_sample(sample, output_shape=truth.shape, iterations=iterations, batch_size=batch_size,
                                convergence=convergence)
    fitted, fit = fit_to_truth(result.potential, truth, sample.meta)
    return fitted, {**fit, **_solver_facts(result)}


def multislice_baseline(sample: Any, truth: np.ndarray,
                        settings: MultisliceSettings) -> tuple[np.ndarray, dict[str, Any]]:
    """Multislice ptychography of ``sample`` on the truth's grid, fitted to ``truth`` (`fit_to_truth`).

    Returns the fitted map and the `ptycho_baseline` facts plus ``n_slices`` and ``slice_thickness_A``.
    """
    from namsa.ptychography.multislice import multislice_from_sample

    result = multislice_from_sample(sample, settings, output_shape=truth.shape)
    fitted, fit = fit_to_truth(result.potential, truth, sample.meta)
    return fitted, {**fit, **_solver_facts(result), "n_slices": result.n_slices,
                    "slice_thickness_A": result.slice_thickness_A}


def _solver_facts(result: Any) -> dict[str, Any]:
    """What the evaluation records of an iterative reconstruction besides the fit."""
    return {"seconds": result.seconds, "error": result.error, "iterations": result.iterations,
            "converged": result.converged}
