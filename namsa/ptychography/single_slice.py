"""Single-slice ptychography of a sample's 4D-STEM stack through py4DSTEM (the microscopists'
iterative baseline, beside iCoM).

py4DSTEM's ``SingleslicePtychography`` (gradient-descent ePIE-family solver, CPU numpy) retrieves
the specimen's phase and the probe from the same CBED stack the network sees; we hand it the
sample's calibrations and read back the phase. For a thin specimen with transmission
``exp(i sigma V_p)`` the phase is ``sigma * V_p`` (sigma: `namsa.constants.interaction_constant`),
so dividing by sigma gives the projected potential in V * Angstrom. By default the solver iterates
until its own data error stops falling (`namsa.ptychography.convergence`); a fixed iteration
count (the old 4-iteration baseline) is still available for comparison. The helpers below
(stack check, calibrations, phase -> potential on the target grid) are shared with
`namsa.ptychography.multislice`.

py4DSTEM is an optional dependency (``pip install 'namsa[baselines]'``, included in ``[dev]``)
imported only when a reconstruction is asked for. We install the ``py4dstem-lite`` distribution
(the same ``py4DSTEM`` package without the ``numpy<2`` pin of ``py4dstem`` 0.14.18, which
cannot be installed beside abTEM and our numpy 2). py4DSTEM is GPL-3.0: we call it, never copy it.

Geometry: our arrays are [row = y, col = x] for both the scan and the detector, k = 0 at pixel
P // 2, so py4DSTEM's first axes ("x") are our rows; the detector is neither rotated nor
transposed against the scan (namsa simulates it so), which we tell py4DSTEM instead of letting
it search for a rotation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from namsa.constants import interaction_constant
from namsa.errors import UserError
from namsa.sample_meta import SampleMeta

from .convergence import ConvergenceLog, ConvergenceRule, iterate
from .object_grid import object_coordinates, to_target_grid

#: what to install when py4DSTEM is missing (the one-line error names it).
INSTALL_HINT = "pip install 'namsa[baselines]' (py4dstem-lite)"
#: the meta fields every ptychography reads that a microscope scan's meta may lack (besides the detector
#: sampling, `SampleMeta.reciprocal_sampling_inv_A`); the scan shape and field of view it always has
SOLVER_FIELDS = ("scan_positions_A", "energy_kv", "semiangle_mrad")


class PtychoError(UserError):
    """Ptychography cannot run on the data given, or py4DSTEM is not installed."""


@dataclass
class PtychoResult:
    """A reconstruction on the requested grid.

    potential: (T, T) projected potential (V * Angstrom) over the scanned field of view, mean
               undetermined (ptychography fixes the phase only up to a constant).
    seconds:   wall time of py4DSTEM's preprocess + reconstruct (s), without the one-off import.
    error:     py4DSTEM's final normalised data error (dimensionless; lower = data better explained).
    iterations: passes over every probe position actually run.
    errors:    the data error after each iteration.
    converged: True when the run stopped on the convergence rule, False on a fixed count or the cap.
    """

    potential: np.ndarray
    seconds: float
    error: float
    iterations: int = 0
    errors: list[float] = field(default_factory=list)
    converged: bool = False


def require_py4dstem() -> None:
    """Import py4DSTEM once, or raise a one-line `PtychoError` saying how to install it."""
    try:
        import py4DSTEM.process.phase  # noqa: F401  (heavy: ~3 s warm, more on a cold cache)
    except ImportError as exc:
        raise PtychoError(f"evaluation.ptycho needs py4DSTEM ({exc}); {INSTALL_HINT}, or set "
                          "evaluation.ptycho: false") from None


def ptycho_from_sample(sample: Any, output_shape: Sequence[int] | None = None, iterations: int | None = None,
                       batch_size: int = 64, seed: int = 0,
                       convergence: ConvergenceRule | None = None) -> PtychoResult:
    """Single-slice ptychography of ``sample.cbed`` on the grid of its targets (V * Angstrom).

    Reads ``scan_shape``, ``scan_positions_A``, ``fov_A``, ``energy_kv``, ``semiangle_mrad``,
    ``aberrations`` (C1_A, C3_mm) and the detector sampling (``reciprocal_sampling_inv_A``) of
    ``sample.meta`` (a `namsa.sample_meta.SampleMeta`). The probe starts as the aperture with the
    sample's aberrations and is refined with the object (probe retrieval, as in practice).
    iterations: a fixed number of passes over all probe positions (py4DSTEM's step size 0.5), or
    None to iterate until ``convergence`` (default `ConvergenceRule()`) says the data error has
    stopped falling; batch_size: positions per gradient update. The truth is never read.
    The target grid's pixel (0, 0) sits at the field-of-view origin ``fov_A[:2]`` (namsa.targets).
    """
    require_py4dstem()
    from py4DSTEM.process.phase import SingleslicePtychography

    cbed4d, positions = checked_stack(sample)
    started = time.perf_counter()
    solver = prepared_solver(SingleslicePtychography, sample.meta, cbed4d, positions)
    log = run_solver(solver, iterations, convergence, max_batch_size=int(batch_size), seed_random=int(seed),
                     object_positivity=False)
    seconds = time.perf_counter() - started
    potential = phase_to_potential(np.asarray(solver.object, dtype=np.float64), solver, sample, positions,
                                   output_shape)
    return PtychoResult(potential, seconds, log.errors[-1], log.iterations, log.errors, log.converged)


def run_solver(solver: Any, iterations: int | None, convergence: ConvergenceRule | None,
               **kwargs: Any) -> ConvergenceLog:
    """A fixed number of iterations (the old baseline) or `convergence.iterate` under ``convergence``."""
    if iterations is not None:
        solver.reconstruct(num_iter=int(iterations), progress_bar=False, reset=True, **kwargs)
        return ConvergenceLog(errors=[float(e) for e in solver.error_iterations])
    return iterate(solver, convergence or ConvergenceRule(), **kwargs)


def checked_stack(sample: Any) -> tuple[np.ndarray, np.ndarray]:
    """(cbed as (scan_y, scan_x, P, P) float32, scan positions (S, 2) in Angstrom), or a `PtychoError`
    (also for a meta without the positions, energy or semi-angle every ptychography reads)."""
    meta = sample.meta
    missing = meta.missing(SOLVER_FIELDS)
    if missing:
        raise PtychoError(f"ptychography needs the scan's {', '.join(missing)} in its meta; pass the sample as "
                          "namsa.simulate_sample wrote it")
    scan_y, scan_x = meta.scan_shape
    cbed = np.asarray(sample.cbed, dtype=np.float32)
    if cbed.ndim != 3 or cbed.shape[0] != scan_y * scan_x or cbed.shape[1] != cbed.shape[2]:
        raise PtychoError(f"cbed shape {cbed.shape} does not hold a {scan_y}x{scan_x} scan of square patterns; "
                          "pass the sample as namsa.simulate_sample wrote it")
    positions = np.asarray(meta.scan_positions_A, dtype=np.float64).reshape(-1, 2)
    return cbed.reshape(scan_y, scan_x, cbed.shape[1], cbed.shape[2]), positions


def solver_arguments(meta: SampleMeta, cbed4d: np.ndarray, positions: np.ndarray) -> dict[str, Any]:
    """The constructor arguments every py4DSTEM ptychography class shares, from the sample's meta."""
    from py4DSTEM import DataCube

    ab = meta.aberrations or {}
    return dict(
        energy=float(meta.energy_kv) * 1e3, datacube=DataCube(data=cbed4d),
        semiangle_cutoff=float(meta.semiangle_mrad), rolloff=0.0,   # namsa's aperture has a hard edge
        # Same convention as namsa.optics (psi(k) ~ exp(-i chi), chi = 2 pi / lambda (C1 a^2/2 + C3 a^4/4)).
        polar_parameters={"C10": float(ab.get("C1_A", 0.0)), "C30": float(ab.get("C3_mm", 0.0)) * 1e7},
        initial_scan_positions=positions.copy(), object_type="potential", verbose=False, device="cpu")


def prepared_solver(solver_class: Any, meta: SampleMeta, cbed4d: np.ndarray, positions: np.ndarray,
                    initial_object: np.ndarray | None = None, **class_arguments: Any) -> Any:
    """A py4DSTEM ptychography solver of ``solver_class`` built from the sample's calibrations
    (`solver_arguments`, plus ``class_arguments`` such as the slices of a multislice one) and
    preprocessed (`preprocess_arguments`). ``initial_object``: py4DSTEM's ``initial_object_guess``,
    for ``object_type="potential"`` the phase (rad) on py4DSTEM's padded object grid, (p, q) for one
    slice or (slices, p, q); None starts from zero phase (py4DSTEM's default)."""
    solver = solver_class(initial_object_guess=initial_object, **class_arguments,
                          **solver_arguments(meta, cbed4d, positions))
    solver.preprocess(**preprocess_arguments(meta, cbed4d.shape))
    return solver


def preprocess_arguments(meta: SampleMeta, shape: Sequence[int]) -> dict[str, Any]:
    """``preprocess`` arguments: the known calibrations instead of py4DSTEM's searches, no plots."""
    p = int(shape[-1])
    return dict(plot_center_of_mass=False, plot_rotation=False, plot_probe_overlaps=False,
                force_com_rotation=0.0, force_com_transpose=False, force_com_shifts=(p // 2, p // 2),
                force_reciprocal_sampling=_k_sampling_inv_A(meta),
                force_scan_sampling=float(meta.fov_A[2]) / int(shape[0]), object_fov_mask=True)


def phase_to_potential(phase: np.ndarray, solver: Any, sample: Any, positions: np.ndarray,
                       output_shape: Sequence[int] | None) -> np.ndarray:
    """The object phase (rad) resampled onto the target grid, over sigma: V * Angstrom, float32."""
    meta = sample.meta
    shape = tuple(output_shape) if output_shape is not None else np.asarray(sample.potential).shape
    grid = object_coordinates(meta, shape, positions, np.asarray(solver.positions), solver.sampling)
    phase_on_targets = to_target_grid(phase, grid, solver.sampling, meta, shape)
    if not np.all(np.isfinite(phase_on_targets)):
        raise PtychoError("ptychography diverged (non-finite phase); lower evaluation.ptycho_convergence.step_size or "
                          "raise evaluation.ptycho_batch_size")
    return (phase_on_targets / interaction_constant(float(meta.energy_kv))).astype(np.float32)


def _k_sampling_inv_A(meta: SampleMeta) -> float:
    """Detector pixel size in 1/Angstrom from the sample's meta."""
    if meta.reciprocal_sampling_inv_A is not None:
        return meta.reciprocal_sampling_inv_A
    raise PtychoError("the sample's meta has no detector sampling (pattern_dk_inv_A or pattern_mrad_per_px); "
                      "ptychography needs it: re-simulate with a current namsa")


__all__ = ["PtychoError", "PtychoResult", "ptycho_from_sample", "require_py4dstem", "INSTALL_HINT", "checked_stack",
           "solver_arguments", "preprocess_arguments", "prepared_solver", "phase_to_potential", "run_solver"]
