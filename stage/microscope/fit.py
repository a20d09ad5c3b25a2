"""Fitting a scan to a model: physics check, scan and detector resampling, tiling and stitching."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .calibration import Calibrations
from .errors import ExperimentalInputError
from .expectation import ModelExpectation
from .files import RawScan

#: relative mismatch of beam energy / convergence angle the model still accepts
PHYSICS_RTOL = 0.01
#: the same for a semi-angle measured from the disc (source "from the data (fit)"): its precision,
#: stage.microscope.checks.RADIUS_RTOL (a thresholded disc on a coarse detector, ~5-10%)
FITTED_RTOL = 0.15


@dataclass
class PreparedScan:
    """A file's scan on the model's sampling, cut into tiles.

    cbed: (B, S, P, P) float32, tile b = (b // tiles[1], b % tiles[1]) row-major, each tile a
    ``scan_shape`` block of probe positions (S row-major); dk_inv_A / step_A: the sampling of the
    stack (1/Angstrom per pattern pixel, Angstrom per scan step); notes: what was resampled.
    """

    cbed: np.ndarray
    tiles: tuple[int, int]
    scan_shape: tuple[int, int]
    dk_inv_A: float
    step_A: tuple[float, float]
    intensity_scale: float
    notes: list[str]


def fit_to_model(scan: RawScan, cal: Calibrations, expect: ModelExpectation) -> PreparedScan:
    """Check the physics, resample scan and detector to the model's sampling, cut into tiles.

    Refuses (one line, ExperimentalInputError) what no resampling can fix: another beam energy or
    convergence angle, a detector coarser than the model's or not reaching its extent, a scan
    step coarser than the model saw, or too few scan points for one tile.
    """
    _check_physics("beam energy", cal.energy_kv, expect.energy_kv, "kV", cal.sources["energy_kv"])
    semi_source = cal.sources["semiangle_mrad"]
    _check_physics("convergence semi-angle", cal.semiangle_mrad, expect.semiangle_mrad, "mrad", semi_source,
                   FITTED_RTOL if "(fit)" in semi_source else PHYSICS_RTOL)
    data, notes = scan.data, []
    total = float(np.mean(np.sum(data, axis=(2, 3), dtype=np.float64)))
    if not total > 0:
        raise ExperimentalInputError(f"{scan.path}: the patterns carry no positive intensity; check the file")
    steps = []
    for axis in (0, 1):
        data, step, note = _fit_scan_axis(data, axis, cal.step_A[axis], expect)
        steps.append(step)
        notes += [note] if note else []
    dk = _target_dk(cal.dk_inv_A, expect)
    for axis in (2, 3):
        data, note = _fit_detector_axis(data, axis, cal.dk_inv_A[axis - 2], dk, expect.pattern_px)
        notes += [note] if note else []
    scale = 1.0 if abs(total - 1.0) <= 0.02 else 1.0 / total
    if scale != 1.0:
        notes.append(f"patterns divided by their mean total intensity {total:.6g} (the model's incident probe carries 1)")
    cbed, tiles, dropped = _tile(data, expect.scan_shape)
    if dropped:
        notes.append(f"{dropped} probe positions beyond the last whole {expect.scan_shape[0]}x{expect.scan_shape[1]} "
                     "tile were left out")
    cbed = cbed if scale == 1.0 else cbed * np.float32(scale)
    return PreparedScan(cbed=cbed, tiles=tiles, scan_shape=expect.scan_shape, dk_inv_A=dk,
                        step_A=(steps[0], steps[1]), intensity_scale=scale, notes=notes)


def _check_physics(what: str, have: float, want: float, unit: str, source: str,
                   rtol: float = PHYSICS_RTOL) -> None:
    if abs(have - want) > rtol * want:
        raise ExperimentalInputError(f"the file's {what} is {have:g} {unit} ({source}) but the model was trained at "
                                     f"{want:g} {unit}; patterns cannot be resampled to another {what}: use a model "
                                     f"trained at {have:g} {unit} (or correct the calibration)")


def _fit_scan_axis(data: np.ndarray, axis: int, step: float,
                   expect: ModelExpectation) -> tuple[np.ndarray, float, str]:
    """Resample scan axis ``axis`` (0 = y, 1 = x) into the model's step range: as is, every m-th
    position (exact), or linear interpolation; returns (data, step used in Angstrom, note)."""
    lo, hi = expect.step_range_A
    name, n, need = "yx"[axis], data.shape[axis], expect.scan_shape[axis]
    if step > hi:
        raise ExperimentalInputError(f"the scan step along {name} is {step:.4g} Angstrom but the model was trained on "
                                     f"steps of {lo:.4g}-{hi:.4g} Angstrom; a coarser scan cannot be refined: scan "
                                     f"with a step <= {hi:.4g} Angstrom")
    note, new_step = "", step
    if step < lo:
        stride = math.ceil(lo / step - 1e-9)
        if stride * step <= hi:
            data, new_step = np.take(data, np.arange(0, n, stride), axis=axis), stride * step
            note = f"scan {name}: one position in {stride} (step {step:.4g} -> {new_step:.4g} Angstrom)"
        else:
            new_step = lo / 0.98
            data = _interpolate_axis(data, axis, np.arange(0.0, n - 1 + 1e-9, new_step / step))
            note = f"scan {name}: interpolated from step {step:.4g} to {new_step:.4g} Angstrom"
    if data.shape[axis] < need:
        raise ExperimentalInputError(f"the scan has {n} positions along {name} at {step:.4g} Angstrom, which give "
                                     f"{data.shape[axis]} at the model's step {new_step:.4g} Angstrom; the model needs "
                                     f"at least {need} (a field of view of >= {need * new_step:.4g} Angstrom)")
    return data, new_step, note


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
    model's range, else the smallest whole multiple of it that does, else the range's start."""
    lo, hi = expect.dk_range_inv_A
    coarse = max(dk_file)
    if coarse > hi:
        raise ExperimentalInputError(f"the detector pixel is {coarse:.4g} 1/Angstrom but the model was trained on "
                                     f"{lo:.4g}-{hi:.4g} 1/Angstrom; a coarser detector cannot be refined: use a "
                                     f"longer camera length (or check --dk-inv-a / --dk-mrad)")
    if lo <= dk_file[0] <= hi and lo <= dk_file[1] <= hi and math.isclose(dk_file[0], dk_file[1], rel_tol=1e-6):
        return dk_file[0]
    multiple = math.ceil(lo / coarse - 1e-9) * coarse
    return multiple if multiple <= hi else lo / 0.98


def _fit_detector_axis(data: np.ndarray, axis: int, dk: float, target_dk: float,
                       pattern_px: int) -> tuple[np.ndarray, str]:
    """Bring detector axis ``axis`` (2 = ky, 3 = kx) to ``pattern_px`` pixels of ``target_dk``
    (k = 0 at index P // 2): a centred crop when the pixel size already fits, else an
    intensity-conserving rebin (namsa.detector.overlap_matrix)."""
    from namsa.detector import overlap_matrix

    n, p = data.shape[axis], pattern_px
    reach_file = (min(n // 2, n - 1 - n // 2) + 0.5) * dk
    reach_model = (min(p // 2, p - 1 - p // 2) + 0.5) * target_dk
    if reach_file < reach_model * (1 - 1e-9):
        raise ExperimentalInputError(f"the detector reaches {reach_file:.4g} 1/Angstrom ({n} px of {dk:.4g}) but the "
                                     f"model needs {reach_model:.4g} 1/Angstrom ({p} px of {target_dk:.4g}); use a "
                                     "shorter camera length or a larger detector region")
    name = "ky" if axis == 2 else "kx"
    if dk == target_dk:
        if n == p:
            return data, ""
        start = n // 2 - p // 2
        return np.take(data, np.arange(start, start + p), axis=axis), f"detector {name}: centred crop {n} -> {p} px"
    source = (np.arange(n + 1) - n // 2 - 0.5) * dk
    target = (np.arange(p + 1) - p // 2 - 0.5) * target_dk
    weights = overlap_matrix(source, target)  # (p, n)
    moved = np.moveaxis(data, axis, -1) @ weights.T
    note = f"detector {name}: rebinned {n} px of {dk:.4g} -> {p} px of {target_dk:.4g} 1/Angstrom"
    return np.moveaxis(moved, -1, axis), note


def _tile(data: np.ndarray, scan_shape: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int], int]:
    """(B, S, P, P) float32 tiles of ``scan_shape`` positions (row-major), the tile grid, and the
    number of positions left out beyond the last whole tile."""
    sy, sx = scan_shape
    ty, tx = data.shape[0] // sy, data.shape[1] // sx
    block = np.asarray(data[: ty * sy, : tx * sx], dtype=np.float32)
    p_y, p_x = block.shape[2:]
    tiles = block.reshape(ty, sy, tx, sx, p_y, p_x).transpose(0, 2, 1, 3, 4, 5).reshape(ty * tx, sy * sx, p_y, p_x)
    return np.ascontiguousarray(tiles), (ty, tx), data.shape[0] * data.shape[1] - ty * sy * tx * sx


def stitch(maps: np.ndarray, tiles: tuple[int, int]) -> np.ndarray:
    """(B, C, T, T) tile maps -> (C, ty * T, tx * T), tile b at (b // tx, b % tx); [row = y, col = x]."""
    ty, tx = tiles
    b, c, t1, t2 = maps.shape
    return maps.reshape(ty, tx, c, t1, t2).transpose(2, 0, 3, 1, 4).reshape(c, ty * t1, tx * t2)


def scan_block(prepared: PreparedScan) -> np.ndarray:
    """The tiles back as one (ty * sy * tx * sx, P, P) stack, row-major over the stitched scan."""
    ty, tx = prepared.tiles
    sy, sx = prepared.scan_shape
    p_y, p_x = prepared.cbed.shape[2:]
    grid = prepared.cbed.reshape(ty, tx, sy, sx, p_y, p_x).transpose(0, 2, 1, 3, 4, 5)
    return grid.reshape(ty * sy * tx * sx, p_y, p_x)
