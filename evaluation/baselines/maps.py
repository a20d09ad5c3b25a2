"""The iCoM, single-slice and multislice ptychography baselines' maps, in physical units (V*Angstrom),
on the targets' grid ([row = y, col = x]), from the CBED stack alone: no function here sees the truth.
Scoring puts each into the views (`evaluation.views`); the reconstructions themselves live in namsa
(`namsa.icom`, `namsa.ptychography`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from namsa.ptychography.convergence import ConvergenceRule
from namsa.ptychography.multislice import MultisliceSettings
from namsa.targets import to_target_resolution

from .cache import Baseline
from .icom import icom_from_sample


def icom_baseline(sample: Any, shape: Sequence[int]) -> Baseline:
    """iCoM of ``sample`` on a ``shape`` grid, calibrated by its detector sampling (V*Angstrom;
    `namsa.icom.icom_from_sample`), and no facts ({})."""
    # Not smoothed to the targets' resolution: iCoM is already blurred by the probe (its resolution is
    # the incoherent probe's, about the targets'), and a second blur measurably lowers its score.
    return np.asarray(icom_from_sample(sample, output_shape=tuple(shape)), dtype=np.float32), {}


def ptycho_baseline(sample: Any, shape: Sequence[int], iterations: int | None, batch_size: int,
                    convergence: ConvergenceRule | None = None) -> Baseline:
    """Single-slice ptychography of ``sample`` on a ``shape`` grid: its phase over the interaction
    constant (V*Angstrom) at the targets' resolution (`at_target_resolution`).

    iterations: a fixed count, or None to iterate until ``convergence`` (on the data error only).
    Returns the map and ``{"seconds", "error", "iterations", "converged"}``: py4DSTEM's compute time for
    this sample (s), its final data error, the iterations run and whether the stop rule (not the cap)
    ended them.
    """
    from namsa.ptychography.single_slice import ptycho_from_sample

    result = ptycho_from_sample(sample, output_shape=tuple(shape), iterations=iterations, batch_size=batch_size,
                                convergence=convergence)
    return at_target_resolution(result.potential, sample.meta), _solver_facts(result)


def multislice_baseline(sample: Any, shape: Sequence[int], settings: MultisliceSettings) -> Baseline:
    """Multislice ptychography of ``sample`` on a ``shape`` grid: the slices' phases summed over the
    interaction constant (V*Angstrom) at the targets' resolution; the `ptycho_baseline` facts plus
    ``n_slices`` and ``slice_thickness_A``."""
    from namsa.ptychography.multislice import multislice_from_sample

    result = multislice_from_sample(sample, settings, output_shape=tuple(shape))
    return at_target_resolution(result.potential, sample.meta), {
        **_solver_facts(result), "n_slices": result.n_slices, "slice_thickness_A": result.slice_thickness_A}


def at_target_resolution(raw: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """``raw`` brought to the targets' resolution when ``meta`` states it (``target_fwhm_A``,
    `namsa.targets.to_target_resolution`), as the network learned it: ptychography, whose maps resolve
    finer than the probe, is not charged for detail finer than the truth holds."""
    if meta.get("target_fwhm_A"):
        raw = to_target_resolution(raw, meta["fov_A"], float(meta["target_fwhm_A"]))
    return np.asarray(raw, dtype=np.float32)


def _solver_facts(result: Any) -> dict[str, Any]:
    """What the evaluation records of an iterative reconstruction."""
    return {"seconds": result.seconds, "error": result.error, "iterations": result.iterations,
            "converged": result.converged}
