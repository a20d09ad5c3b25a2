"""Fitting a scan to a model: physics check, then scan and detector resampling block by block.

`sampling_problems` finds every problem of a file no resampling can fix (with what calibrations are
known: the shape alone tells a too small scan or detector); `plan_fit` refuses them all in one line,
else decides from the file's shape and calibrations alone (nothing is read) how each scan
axis and each detector axis is brought to the model's sampling; `read_fitted` then reads one block
of the scan and applies that plan, and `normalise_tile` scales a tile's patterns the way the
training patterns were scaled (after the crop: the model's detector carries the probe's 1).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from stage.microscope.calibration import Calibrations
from stage.microscope.errors import ExperimentalInputError, all_problems
from .expectation import FITTED_RTOL, PHYSICS_RTOL, ModelExpectation, physics_rtol

__all__ = ["plan_fit", "sampling_problems", "read_fitted", "normalise_tile", "FitPlan", "ScanAxis",
           "PatternTransform", "PHYSICS_RTOL", "FITTED_RTOL", "UNIT_TOTAL_RTOL"]

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

    Refuses what no resampling can fix (`sampling_problems`: another beam energy or convergence
    angle, a detector coarser than the model's or not reaching its extent, a scan step coarser than
    the model saw, too few scan points for one tile), every such problem in one line.
    """
    problems = sampling_problems(shape, asdict(cal), expect)
    if problems:
        raise all_problems(problems)
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


def sampling_problems(shape: tuple[int, ...], known: Mapping[str, Any], expect: ModelExpectation) -> list[str]:
    """Every problem of a (scan_y, scan_x, ky, kx) scan that no flag can fix for this model, one
    line each, with the calibrations ``known`` so far (stage.microscope.calibration.known_calibrations:
    energy_kv, semiangle_mrad, dk_inv_A, step_A, sources); a check whose calibration is not known
    yet is made as far as the shape alone allows (a scan or detector too small at any step or pixel)."""
    sources = known.get("sources", {})
    problems = [_physics_problem(what, known.get(name), want, unit, sources.get(name, ""))
                for what, name, want, unit in (("beam energy", "energy_kv", expect.energy_kv, "kV"),
                                               ("convergence semi-angle", "semiangle_mrad", expect.semiangle_mrad,
                                                "mrad"))]
    step = known.get("step_A")
    problems += [_scan_axis_problem(shape[axis], axis, None if step is None else step[axis], expect) for axis in (0, 1)]
    problems += _detector_problems(shape, known.get("dk_inv_A"), expect)
    return [p for p in problems if p]


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
    not already 1 (within UNIT_TOTAL_RTOL), left as they are when they hold no count at all; returns
    (patterns, the factor applied)."""
    total = float(np.mean(np.sum(tile, axis=(-2, -1), dtype=np.float64)))
    if total == 0.0:  # not one count in the tile (a blanked beam, a very low dose): nothing to scale, still data
        return tile, 1.0
    if not total > 0:
        raise ExperimentalInputError(f"{where}: the patterns carry a negative total intensity ({total:.4g}) on the "
                                     "model's detector; check the file (a dark reference subtracted with an offset?)")
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


def _physics_problem(what: str, have: float | None, want: float, unit: str, source: str) -> str | None:
    if have is None or abs(have - want) <= physics_rtol(source) * want:
        return None
    return (f"the file's {what} is {have:g} {unit} ({source}) but the model was trained at {want:g} {unit}; "
            f"patterns cannot be resampled to another {what}: use a model trained at {have:g} {unit} (or correct "
            "the calibration)")


def _scan_positions(n: int, step: float, expect: ModelExpectation) -> tuple[np.ndarray, float, str]:
    """(the file's indices of the fitted positions, their step Angstrom, a note) along an axis of
    ``n`` positions of ``step`` (positive, no coarser than the model's range): as is, every m-th
    position (exact), or linear interpolation to the finest step the model saw."""
    lo, hi = expect.step_range_A
    if step >= lo:
        return np.arange(n, dtype=np.float64), step, ""
    stride = math.ceil(lo / step - 1e-9)
    if stride * step <= hi:
        return (np.arange(0, n, stride, dtype=np.float64), stride * step,
                f"one position in {stride} (step {step:.4g} -> {stride * step:.4g} Angstrom)")
    new_step = expect.step_A[0]
    return (np.arange(0.0, n - 1 + 1e-9, new_step / step), new_step,
            f"interpolated from step {step:.4g} to {new_step:.4g} Angstrom")


def _scan_axis_problem(n: int, axis: int, signed_step: float | None, expect: ModelExpectation) -> str | None:
    """Why scan axis ``axis`` (0 = y, 1 = x) of ``n`` positions cannot be fitted, or None: a step
    coarser than the model's range, or too few positions (at any step: resampling never adds any)."""
    lo, hi = expect.step_range_A
    name, need = "yx"[axis], expect.scan_shape[axis]
    if signed_step is None:
        return None if n >= need else (f"the scan has {n} positions along {name}; the model needs at least {need} "
                                       "at its step, and resampling never adds positions")
    step = abs(signed_step)
    if step > hi:
        few = f" (and its {n} positions are fewer than the {need} the model needs)" if n < need else ""
        return (f"the scan step along {name} is {step:.4g} Angstrom but the model was trained on steps of "
                f"{lo:.4g}-{hi:.4g} Angstrom{few}; a coarser scan cannot be refined: scan with a step <= {hi:.4g} "
                "Angstrom")
    positions, new_step, _ = _scan_positions(n, step, expect)
    if len(positions) < need:
        return (f"the scan has {n} positions along {name} at {step:.4g} Angstrom, which give {len(positions)} at the "
                f"model's step {new_step:.4g} Angstrom; the model needs at least {need} (a field of view of >= "
                f"{need * new_step:.4g} Angstrom)")
    return None


def _fit_scan_axis(n: int, axis: int, signed_step: float, expect: ModelExpectation) -> ScanAxis:
    """Scan axis ``axis`` (0 = y, 1 = x) of ``n`` positions brought into the model's step range
    (`_scan_positions`; `_scan_axis_problem` has passed). A negative step (the file's axis runs
    against the calibrated direction) is read backwards, so that the maps run along +y / +x, and
    the note says so: the map is never mirrored silently."""
    name = "yx"[axis]
    positions, new_step, note = _scan_positions(n, abs(signed_step), expect)
    notes = [f"scan {name}: {note}"] if note else []
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
    model's range, else the smallest whole multiple of it that does, else the finest the model saw
    (`_detector_problems` has refused a coarser one)."""
    lo, hi = expect.dk_range_inv_A
    coarse = max(dk_file)
    if lo <= dk_file[0] <= hi and lo <= dk_file[1] <= hi and math.isclose(dk_file[0], dk_file[1], rel_tol=1e-6):
        return dk_file[0]
    multiple = math.ceil(lo / coarse - 1e-9) * coarse
    return multiple if multiple <= hi else expect.dk_inv_A[0]


def _detector_problems(shape: tuple[int, ...], dk_file: tuple[float, float] | None,
                       expect: ModelExpectation) -> list[str]:
    """Why the detector of a scan of ``shape`` with pixel ``dk_file`` (1/Angstrom, (y, x); None: not
    known yet) cannot give the model's patterns: a pixel coarser than the model's range, or an axis
    not reaching the model's pattern from k = 0 (fewer pixels than the pattern never do)."""
    p = expect.pattern_px
    if dk_file is None:
        return [f"the detector has {shape[axis]} px along {'ky' if axis == 2 else 'kx'}, fewer than the model's "
                f"{p} px patterns at any pixel size; use a larger detector region" for axis in (2, 3) if shape[axis] < p]
    lo, hi = expect.dk_range_inv_A
    if max(dk_file) > hi:
        return [f"the detector pixel is {max(dk_file):.4g} 1/Angstrom but the model was trained on {lo:.4g}-{hi:.4g} "
                "1/Angstrom; a coarser detector cannot be refined: use a longer camera length (or check --dk-inv-a / "
                "--dk-mrad)"]
    target = _target_dk(dk_file, expect)
    problems = []
    for axis in (2, 3):
        n, dk = shape[axis], dk_file[axis - 2]
        reach_file = (min(n // 2, n - 1 - n // 2) + 0.5) * dk
        reach_model = (min(p // 2, p - 1 - p // 2) + 0.5) * target
        if reach_file < reach_model * (1 - 1e-9) or (dk == target and n < p):
            problems.append(f"the detector reaches {reach_file:.4g} 1/Angstrom along {'ky' if axis == 2 else 'kx'} "
                            f"({n} px of {dk:.4g}) but the model needs {reach_model:.4g} 1/Angstrom ({p} px of "
                            f"{target:.4g}); use a shorter camera length or a larger detector region")
    return problems


def _fit_detector_axis(n: int, axis: int, dk: float, target_dk: float,
                       pattern_px: int) -> tuple[np.ndarray | None, int, str]:
    """How detector axis ``axis`` (2 = ky, 3 = kx) of ``n`` pixels of ``dk`` becomes ``pattern_px``
    pixels of ``target_dk`` (k = 0 at index P // 2; `_detector_problems` has passed): (None, start,
    note) for a centred crop when the pixel size already fits, else (weights, 0, note) for an
    intensity-conserving rebin (namsa.detector.overlap_matrix)."""
    from namsa.detector import overlap_matrix

    p = pattern_px
    name = "ky" if axis == 2 else "kx"
    if dk == target_dk:
        return None, n // 2 - p // 2, "" if n == p else f"detector {name}: centred crop {n} -> {p} px"
    source = (np.arange(n + 1) - n // 2 - 0.5) * dk
    target = (np.arange(p + 1) - p // 2 - 0.5) * target_dk
    note = f"detector {name}: rebinned {n} px of {dk:.4g} -> {p} px of {target_dk:.4g} 1/Angstrom"
    return overlap_matrix(source, target), 0, note
