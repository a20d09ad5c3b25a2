"""Fitting a scan to a model: physics check, then scan and detector resampling block by block.

`plan_fit` decides from the file's shape and calibrations alone (nothing is read) how each scan
axis and each detector axis is brought to the model's sampling; `read_fitted` then reads one block
of the scan and applies that plan, and `normalise_tile` scales a tile's patterns the way the
training patterns were scaled (after the crop: the model's detector carries the probe's 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from stage.microscope.calibration import Calibrations
from stage.microscope.errors import ExperimentalInputError
from .expectation import ModelExpectation

#: relative mismatch of beam energy / convergence angle the model still accepts
PHYSICS_RTOL = 0.01
#: the same for a semi-angle measured from the disc (source "from the data (fit)"): its precision,
#: stage.microscope.checks.RADIUS_RTOL (a thresholded disc on a coarse detector, ~5-10%)
FITTED_RTOL = 0.15
#: a tile whose mean pattern total is within this of 1 is used as is (the training scale)
UNIT_TOTAL_RTOL = 0.02
#: a raw block (y0, x0 in the file's scan) -> the block to fit (e.g. a recentring of the patterns)
PatternTransform = Callable[[np.ndarray, int, int], np.ndarray]


@dataclass
class ScanAxis:
    """One scan axis of the fit: ``positions[i]`` = the file's (fractional) index of fitted probe
    position i; ``step_A`` its spacing; ``flipped``: the file's step was negative."""

    positions: np.ndarray
    step_A: float
    flipped: bool
    note: str


@dataclass
class FitPlan:
    """How a file's scan is brought to a model's sampling (`plan_fit`); ``weights[a]``: the
    (P, n) rebinning of detector axis a, or None for a centred crop from ``starts[a]``."""

    scan: tuple[ScanAxis, ScanAxis]
    weights: tuple[np.ndarray | None, np.ndarray | None]
    starts: tuple[int, int]
    dk_inv_A: float
    pattern_px: int
    notes: list[str] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int]:
        """(y, x) fitted probe positions."""
        return len(self.scan[0].positions), len(self.scan[1].positions)

    @property
    def step_A(self) -> tuple[float, float]:
        """Scan step (y, x) of the fitted scan, Angstrom (positive)."""
        return self.scan[0].step_A, self.scan[1].step_A


def plan_fit(shape: tuple[int, ...], cal: Calibrations, expect: ModelExpectation) -> FitPlan:
    """Check the physics and decide the resampling of a (scan_y, scan_x, ky, kx) scan.

    Refuses (one line, ExperimentalInputError) what no resampling can fix: another beam energy or
    convergence angle, a detector coarser than the model's or not reaching its extent, a scan
    step coarser than the model saw, or too few scan points for one tile.
    """
    _check_physics("beam energy", cal.energy_kv, expect.energy_kv, "kV", cal.sources["energy_kv"])
    semi_source = cal.sources["semiangle_mrad"]
    _check_physics("convergence semi-angle", cal.semiangle_mrad, expect.semiangle_mrad, "mrad", semi_source,
                   FITTED_RTOL if "(fit)" in semi_source else PHYSICS_RTOL)
    scan = tuple(_fit_scan_axis(shape[axis], axis, cal.step_A[axis], expect) for axis in (0, 1))
    dk = _target_dk(cal.dk_inv_A, expect)
    weights, starts, notes = [], [], [a.note for a in scan if a.note]
    for axis in (2, 3):
        w, start, note = _fit_detector_axis(shape[axis], axis, cal.dk_inv_A[axis - 2], dk, expect.pattern_px)
        weights.append(w)
        starts.append(start)
        notes += [note] if note else []
    return FitPlan(scan=scan, weights=(weights[0], weights[1]), starts=(starts[0], starts[1]),  # type: ignore[arg-type]
                   dk_inv_A=dk, pattern_px=expect.pattern_px, notes=notes)


def read_fitted(data: Any, plan: FitPlan, rows: tuple[int, int], cols: tuple[int, int],
                transform: PatternTransform | None = None) -> np.ndarray:
    """Fitted probe positions [rows) x [cols) as (h, w, P, P) float32: the file's block around them
    is read (``data[y0:y1, x0:x1]``), passed through ``transform(block, y0, x0)``, cropped or rebinned
    to the model's detector, then resampled to the fitted positions."""
    py, px = (axis.positions[lo:hi] for axis, (lo, hi) in zip(plan.scan, (rows, cols)))
    (y0, y1), (x0, x1) = _span(py, data.shape[0]), _span(px, data.shape[1])
    block = data[y0:y1, x0:x1]
    if transform is not None:
        block = transform(block, y0, x0)
    for axis in (2, 3):
        block = _detector(block, axis, plan.weights[axis - 2], plan.starts[axis - 2], plan.pattern_px)
    block = _at_positions(block, 0, py - y0)
    return np.ascontiguousarray(_at_positions(block, 1, px - x0), dtype=np.float32)


def normalise_tile(tile: np.ndarray, where: str) -> tuple[np.ndarray, float]:
    """A tile's (S, P, P) patterns on the training scale: divided by their mean total when it is
    not already 1 (within UNIT_TOTAL_RTOL); returns (patterns, the factor applied)."""
    total = float(np.mean(np.sum(tile, axis=(-2, -1), dtype=np.float64)))
    if not total > 0:
        raise ExperimentalInputError(f"{where}: the patterns carry no positive intensity on the model's detector; "
                                     "check the file (and that the direct beam is at the detector's centre)")
    if abs(total - 1.0) <= UNIT_TOTAL_RTOL:
        return tile, 1.0
    return tile * np.float32(1.0 / total), 1.0 / total


def _span(positions: np.ndarray, n: int) -> tuple[int, int]:
    """The file indices [lo, hi) that linear interpolation at ``positions`` reads."""
    lo = int(np.floor(positions.min()))
    return lo, min(int(np.ceil(positions.max())), n - 1) + 1


def _at_positions(block: np.ndarray, axis: int, positions: np.ndarray) -> np.ndarray:
    """``block`` along ``axis`` at fractional ``positions``: exact picks where they are whole."""
    whole = np.rint(positions)
    if np.allclose(positions, whole, rtol=0, atol=1e-9):
        return np.take(block, whole.astype(int), axis=axis)
    return _interpolate_axis(block, axis, positions)


def _detector(block: np.ndarray, axis: int, weights: np.ndarray | None, start: int, p: int) -> np.ndarray:
    """Detector axis ``axis`` brought to ``p`` pixels: rebinned by ``weights`` or cropped."""
    if weights is not None:
        return np.moveaxis(np.moveaxis(block, axis, -1) @ weights.T, -1, axis)
    if block.shape[axis] == p:
        return block
    return np.take(block, np.arange(start, start + p), axis=axis)


def _check_physics(what: str, have: float, want: float, unit: str, source: str,
                   rtol: float = PHYSICS_RTOL) -> None:
    if abs(have - want) > rtol * want:
        raise ExperimentalInputError(f"the file's {what} is {have:g} {unit} ({source}) but the model was trained at "
                                     f"{want:g} {unit}; patterns cannot be resampled to another {what}: use a model "
                                     f"trained at {have:g} {unit} (or correct the calibration)")


def _fit_scan_axis(n: int, axis: int, signed_step: float, expect: ModelExpectation) -> ScanAxis:
    """Scan axis ``axis`` (0 = y, 1 = x) of ``n`` positions brought into the model's step range:
    as is, every m-th position (exact), or linear interpolation. A negative step (the file's axis
    runs against the calibrated direction) is read backwards, so that the maps run along +y / +x,
    and the note says so: the map is never mirrored silently."""
    lo, hi = expect.step_range_A
    name, need, step = "yx"[axis], expect.scan_shape[axis], abs(signed_step)
    if step > hi:
        raise ExperimentalInputError(f"the scan step along {name} is {step:.4g} Angstrom but the model was trained on "
                                     f"steps of {lo:.4g}-{hi:.4g} Angstrom; a coarser scan cannot be refined: scan "
                                     f"with a step <= {hi:.4g} Angstrom")
    notes, new_step, positions = [], step, np.arange(n, dtype=np.float64)
    if step < lo:
        stride = math.ceil(lo / step - 1e-9)
        if stride * step <= hi:
            positions, new_step = np.arange(0, n, stride, dtype=np.float64), stride * step
            notes.append(f"scan {name}: one position in {stride} (step {step:.4g} -> {new_step:.4g} Angstrom)")
        else:
            new_step = expect.step_A[0]  # the finest step the model saw
            positions = np.arange(0.0, n - 1 + 1e-9, new_step / step)
            notes.append(f"scan {name}: interpolated from step {step:.4g} to {new_step:.4g} Angstrom")
    if len(positions) < need:
        raise ExperimentalInputError(f"the scan has {n} positions along {name} at {step:.4g} Angstrom, which give "
                                     f"{len(positions)} at the model's step {new_step:.4g} Angstrom; the model needs "
                                     f"at least {need} (a field of view of >= {need * new_step:.4g} Angstrom)")
    if signed_step < 0:
        positions = (n - 1) - positions
        notes.append(f"scan {name}: the file's step is negative (the axis runs against +{name}); read backwards so "
                     f"the maps run along +{name} (map {'row' if axis == 0 else 'column'} 0 = the file's last "
                     f"{'row' if axis == 0 else 'column'})")
    return ScanAxis(positions=positions, step_A=new_step, flipped=signed_step < 0, note="; ".join(notes))


def _interpolate_axis(data: np.ndarray, axis: int, positions: np.ndarray) -> np.ndarray:
    """Linear interpolation of ``data`` along ``axis`` at fractional indices ``positions``."""
    i0 = np.clip(np.floor(positions).astype(int), 0, data.shape[axis] - 1)
    i1 = np.clip(i0 + 1, 0, data.shape[axis] - 1)
    shape = [1] * data.ndim
    shape[axis] = len(positions)
    w = (positions - i0).reshape(shape)
    return (1.0 - w) * np.take(data, i0, axis=axis) + w * np.take(data, i1, axis=axis)


def _target_dk(dk_file: tuple[float, float], expect: ModelExpectation) -> float:
    """Detector pixel (1/Angstrom) the patterns are brought to: the file's own when it lies in the
    model's range, else the smallest whole multiple of it that does, else the finest the model saw."""
    lo, hi = expect.dk_range_inv_A
    coarse = max(dk_file)
    if coarse > hi:
        raise ExperimentalInputError(f"the detector pixel is {coarse:.4g} 1/Angstrom but the model was trained on "
                                     f"{lo:.4g}-{hi:.4g} 1/Angstrom; a coarser detector cannot be refined: use a "
                                     f"longer camera length (or check --dk-inv-a / --dk-mrad)")
    if lo <= dk_file[0] <= hi and lo <= dk_file[1] <= hi and math.isclose(dk_file[0], dk_file[1], rel_tol=1e-6):
        return dk_file[0]
    multiple = math.ceil(lo / coarse - 1e-9) * coarse
    return multiple if multiple <= hi else expect.dk_inv_A[0]


def _fit_detector_axis(n: int, axis: int, dk: float, target_dk: float,
                       pattern_px: int) -> tuple[np.ndarray | None, int, str]:
    """How detector axis ``axis`` (2 = ky, 3 = kx) of ``n`` pixels of ``dk`` becomes ``pattern_px``
    pixels of ``target_dk`` (k = 0 at index P // 2): (None, start, note) for a centred crop when
    the pixel size already fits, else (weights, 0, note) for an intensity-conserving rebin
    (namsa.detector.overlap_matrix)."""
    from namsa.detector import overlap_matrix

    p = pattern_px
    reach_file = (min(n // 2, n - 1 - n // 2) + 0.5) * dk
    reach_model = (min(p // 2, p - 1 - p // 2) + 0.5) * target_dk
    if reach_file < reach_model * (1 - 1e-9):
        raise ExperimentalInputError(f"the detector reaches {reach_file:.4g} 1/Angstrom ({n} px of {dk:.4g}) but the "
                                     f"model needs {reach_model:.4g} 1/Angstrom ({p} px of {target_dk:.4g}); use a "
                                     "shorter camera length or a larger detector region")
    name = "ky" if axis == 2 else "kx"
    if dk == target_dk:
        return None, n // 2 - p // 2, "" if n == p else f"detector {name}: centred crop {n} -> {p} px"
    source = (np.arange(n + 1) - n // 2 - 0.5) * dk
    target = (np.arange(p + 1) - p // 2 - 0.5) * target_dk
    note = f"detector {name}: rebinned {n} px of {dk:.4g} -> {p} px of {target_dk:.4g} 1/Angstrom"
    return overlap_matrix(source, target), 0, note
