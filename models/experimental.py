"""Experimental 4D-STEM files -> the stack a trained reconstructor expects (`namsa reconstruct`).

Three steps, each a plain function:

1. `read_scan(path)`: a 4-D dataset (scan_y, scan_x, ky, kx) and the calibrations its metadata
   holds, through rosettasciio (``rsciio``, GPL-3.0, imported lazily: ``pip install -e '.[io]'``).
2. `resolve_calibrations(found, given)`: beam energy (kV), convergence semi-angle (mrad), detector
   pixel size (1/Angstrom) and scan step (Angstrom); a value given on the command line wins over
   the file's; a missing one is a one-line error naming its flag.
3. `fit_to_model(scan, calibrations, expectation)`: checks the physics against what the model
   was trained on (`model_expectation`), resamples the detector and the scan to the model's
   sampling, and cuts the scan into tiles of the model's scan shape.

Axis conventions: maps are [row = y, col = x]; a file's data is (scan_y, scan_x, ky, kx); a
model's stack is (S, P, P) with S = scan_y * scan_x row-major and k = 0 at index P // 2 (the
same convention is assumed for the file's detector: centre its patterns first).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from namsa.constants import wavelength_A
from namsa.errors import UserError

from .microscope_files import check_file, check_values

#: file extension -> rosettasciio plugin module that reads it
READERS: dict[str, str] = {".hspy": "rsciio.hspy", ".hdf5": "rsciio.hspy", ".h5": "rsciio.hspy",
                           ".zspy": "rsciio.zspy", ".emd": "rsciio.emd", ".mib": "rsciio.quantumdetector",
                           ".xml": "rsciio.empad", ".raw": "rsciio.empad", ".dm4": "rsciio.digitalmicrograph",
                           ".dm3": "rsciio.digitalmicrograph", ".blo": "rsciio.blockfile"}
#: calibration name -> (what it is, the command-line flag that gives it)
FLAGS: dict[str, tuple[str, str]] = {
    "energy_kv": ("beam energy (kV)", "--energy-kv"),
    "semiangle_mrad": ("convergence semi-angle (mrad)", "--semiangle-mrad"),
    "dk_inv_A": ("detector pixel size (1/Angstrom or mrad)", "--dk-inv-a (or --dk-mrad)"),
    "step_A": ("scan step (Angstrom)", "--scan-step-a")}
#: relative mismatch of beam energy / convergence angle the model still accepts
PHYSICS_RTOL = 0.01
#: length units -> Angstrom; reciprocal units -> 1/Angstrom
_LENGTH = {"a": 1.0, "å": 1.0, "angstrom": 1.0, "nm": 10.0, "pm": 0.01, "um": 1e4, "µm": 1e4, "μm": 1e4}
_RECIPROCAL = {"1/a": 1.0, "1/å": 1.0, "a^-1": 1.0, "å^-1": 1.0, "1/angstrom": 1.0, "1/nm": 0.1, "nm^-1": 0.1}
_ANGLE = {"mrad": 1.0, "rad": 1e3}


class ExperimentalInputError(UserError):
    """An experimental file, its calibrations, or its fit to a model is wrong (one line)."""


@dataclass
class RawScan:
    """A 4-D dataset as read: ``data`` (scan_y, scan_x, ky, kx) and calibrations found in the file.

    ``found`` maps a calibration name (energy_kv, semiangle_mrad, dk_inv_A, dk_mrad, step_A) to
    its value in those units; dk_* and step_A are (y, x) pairs.
    """

    data: np.ndarray
    found: dict[str, Any]
    path: str


@dataclass
class Calibrations:
    """Calibrations used: energy (kV), semi-angle (mrad), detector pixel (dky, dkx) 1/Angstrom,
    scan step (dy, dx) Angstrom, and where each came from (``sources``: name -> text)."""

    energy_kv: float
    semiangle_mrad: float
    dk_inv_A: tuple[float, float]
    step_A: tuple[float, float]
    sources: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelExpectation:
    """The physics and sampling a reconstructor was trained on.

    ``dk_range_inv_A`` / ``step_range_A``: the detector pixel (1/Angstrom) and scan step (Angstrom)
    its training data spanned; a file inside both is used as is, else it is resampled.
    """

    energy_kv: float
    semiangle_mrad: float
    scan_shape: tuple[int, int]
    pattern_px: int
    target_px: int
    dk_range_inv_A: tuple[float, float]
    step_range_A: tuple[float, float]
    source: str


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


# --------------------------------------------------------------------------------------------
# 1. reading


def read_scan(path: str | Path) -> RawScan:
    """Read a 4-D STEM file through rosettasciio; the first 4-D dataset in it is used."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentalInputError(f"{path} does not exist or is not a file; pass a 4D-STEM file "
                                     f"({', '.join(sorted(READERS))})")
    check_file(path)  # before rsciio opens it: nothing outside the file is followed
    signals = _rsciio_read(path)
    four_d = [s for s in signals if np.ndim(s.get("data")) == 4]
    if not four_d:
        shapes = [tuple(np.shape(s.get("data"))) for s in signals]
        raise ExperimentalInputError(f"{path} holds no 4-D dataset (found shapes {shapes}); namsa reconstruct needs "
                                     "(scan_y, scan_x, ky, kx) data")
    signal = four_d[0]
    data = np.asarray(signal["data"])
    check_values(data, str(path))
    return RawScan(data=data, found=_calibrations_in(signal), path=str(path))


def _rsciio_read(path: Path) -> list[dict[str, Any]]:
    import importlib

    module = READERS.get(path.suffix.lower())
    if module is None:
        raise ExperimentalInputError(f"{path}: unknown file type {path.suffix!r}; namsa reconstruct reads "
                                     f"{', '.join(sorted(READERS))} (convert other formats to .hspy)")
    try:
        reader = importlib.import_module(module).file_reader
    except ImportError:
        raise ExperimentalInputError("reading experimental files needs rosettasciio: pip install -e '.[io]'") from None
    try:
        kwargs = {"lazy": False} if module in ("rsciio.hspy", "rsciio.zspy", "rsciio.emd") else {}
        return list(reader(str(path), **kwargs))
    except Exception as exc:  # any parser failure of a foreign file is bad input
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ExperimentalInputError(f"{path} could not be read as {module.split('.')[-1]} ({text}); check the "
                                     "file is complete and of that format") from None


def _calibrations_in(signal: Mapping[str, Any]) -> dict[str, Any]:
    """Calibrations stored in an rsciio signal dict: beam energy (kV) and convergence semi-angle
    (mrad) from HyperSpy's ``Acquisition_instrument.TEM.beam_energy`` / ``convergence_angle``
    (or the same names among an EMD file's ``microscope`` attributes), and the axis scales with
    their units (axes 0, 1: scan step in a length unit; axes 2, 3: detector pixel in 1/length or
    mrad / rad). Axes without a recognised unit give nothing."""
    found: dict[str, Any] = {}
    tem = signal.get("metadata", {}).get("Acquisition_instrument", {}).get("TEM", {})
    microscope = signal.get("original_metadata", {}).get("microscope", {})  # EMD (NCEM) root attributes
    for key, name in (("beam_energy", "energy_kv"), ("convergence_angle", "semiangle_mrad")):
        for where in (tem, microscope):
            if name not in found and _positive(where.get(key)):
                found[name] = float(where[key])
    axes = sorted(signal.get("axes", []), key=lambda a: a.get("index_in_array", 0))
    if len(axes) == 4:
        found.update(_axis_pair(axes[:2], _LENGTH, "step_A"))
        found.update(_axis_pair(axes[2:], _RECIPROCAL, "dk_inv_A"))
        found.update(_axis_pair(axes[2:], _ANGLE, "dk_mrad"))
    return found


def _axis_pair(axes: Sequence[Mapping[str, Any]], units: Mapping[str, float], name: str) -> dict[str, Any]:
    """{name: (y, x) scale in the table's unit} when both axes carry a unit of the table."""
    values = []
    for axis in axes:
        unit = str(axis.get("units") or "").strip().lower().replace(" ", "")
        scale = axis.get("scale")
        if unit not in units or not _positive(scale):
            return {}
        values.append(float(scale) * units[unit])
    return {name: tuple(values)}


def _positive(value: Any) -> bool:
    try:
        return math.isfinite(float(value)) and float(value) > 0
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# 2. calibrations


def resolve_calibrations(found: Mapping[str, Any], given: Mapping[str, Any]) -> Calibrations:
    """The calibrations to use: ``given`` (command line; None = not given) wins over ``found`` (file).

    given keys: energy_kv, semiangle_mrad, dk_inv_A, dk_mrad, step_A (scalars or (y, x) pairs).
    A detector pixel in mrad is converted to 1/Angstrom with the beam energy (k = theta / lambda).
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in ("energy_kv", "semiangle_mrad", "dk_inv_A", "dk_mrad", "step_A"):
        if given.get(name) is not None:
            values[name], sources[name] = given[name], "command line"
        elif found.get(name) is not None:
            values[name], sources[name] = found[name], "file metadata"
    if "dk_inv_A" in values and "dk_mrad" in values and sources["dk_inv_A"] != sources["dk_mrad"]:
        values.pop("dk_mrad" if sources["dk_inv_A"] == "command line" else "dk_inv_A")
    for name in ("energy_kv", "semiangle_mrad", "step_A"):
        _require(values, name)
    if "dk_inv_A" not in values and "dk_mrad" in values:
        lam = wavelength_A(float(values["energy_kv"]))
        values["dk_inv_A"] = tuple(v * 1e-3 / lam for v in _pair(values["dk_mrad"], "--dk-mrad"))
        sources["dk_inv_A"] = f"{sources['dk_mrad']} (mrad, converted at {float(values['energy_kv']):g} kV)"
    _require(values, "dk_inv_A")
    return Calibrations(energy_kv=_scalar(values["energy_kv"], "--energy-kv"),
                        semiangle_mrad=_scalar(values["semiangle_mrad"], "--semiangle-mrad"),
                        dk_inv_A=_pair(values["dk_inv_A"], "--dk-inv-a"), step_A=_pair(values["step_A"], "--scan-step-a"),
                        sources={k: v for k, v in sources.items() if k != "dk_mrad"})


def _require(values: Mapping[str, Any], name: str) -> None:
    if name not in values:
        what, flag = FLAGS[name]
        raise ExperimentalInputError(f"the file's metadata has no {what}; give it with {flag}")


def _scalar(value: Any, flag: str) -> float:
    if not _positive(value):
        raise ExperimentalInputError(f"{flag} must be a positive number, got {value!r}")
    return float(value)


def _pair(value: Any, flag: str) -> tuple[float, float]:
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
    arr = np.repeat(arr, 2) if arr.size == 1 else arr
    if arr.size != 2 or not all(_positive(v) for v in arr):
        raise ExperimentalInputError(f"{flag} must be one positive number or a (y, x) pair, got {value!r}")
    return float(arr[0]), float(arr[1])


# --------------------------------------------------------------------------------------------
# what a model expects


def model_expectation(card: Mapping[str, Any]) -> ModelExpectation:
    """The physics a reconstructor was trained on, from its card.

    A published model (``pretrained:<name>``) states it in ``expects_input`` (the simulation
    config): the supercell is the smallest whole number of unit cells at least ``cell_lateral_A``
    wide and the grid the smallest 2,3-smooth pixel count at least as fine as ``sampling_A``, so
    the training scan steps spanned [cell_lateral_A, 2 cell_lateral_A) / scan and the detector
    pixels [1, 4/3) x band_limit / (sampling_A * pattern_px). A model fresh from `namsa train`
    has no such section: the range is read from the samples of its training stores instead.
    """
    expects = card.get("expects_input")
    if expects:
        return _from_expects(expects)
    dirs = (card.get("data") or {}).get("dirs")
    if dirs:
        return _from_stores(dirs)
    raise ExperimentalInputError("the model's card says neither what input it expects (expects_input) nor where its "
                                 "training data is; publish it with python -m workflow.pretrained RUN NAME")


def _from_expects(e: Mapping[str, Any]) -> ModelExpectation:
    sy, sx = (int(v) for v in e["scan_shape"])
    dk = float(e["band_limit"]) / (float(e["sampling_A"]) * int(e["pattern_px"]))
    step = float(e["cell_lateral_A"]) / max(sy, sx)
    return ModelExpectation(energy_kv=float(e["energy_kv"]), semiangle_mrad=float(e["semiangle_mrad"]),
                            scan_shape=(sy, sx), pattern_px=int(e["pattern_px"]), target_px=int(e["target_px"]),
                            dk_range_inv_A=(0.98 * dk, 1.34 * dk), step_range_A=(0.98 * step, 2.0 * step),
                            source="model card expects_input")


def _from_stores(dirs: Sequence[str], limit: int = 64) -> ModelExpectation:
    """Range of the training samples' sampling (the first ``limit`` samples of the first store, 2% slack)."""
    import stage

    try:
        with stage.open_store(dirs[0]) as store:
            samples = [store[i] for i in range(min(limit, len(store)))]
    except UserError as exc:
        raise ExperimentalInputError(f"the model's card names no expects_input and its training data cannot be read "
                                     f"({exc}); publish it with python -m workflow.pretrained RUN NAME") from None
    first = samples[0]
    dks = [float(s.meta["pattern_dk_inv_A"]) for s in samples]
    steps = [float(s.meta["fov_A"][k + 2]) / int(s.meta["scan_shape"][k]) for s in samples for k in (0, 1)]
    sy, sx = (int(v) for v in first.meta["scan_shape"])
    return ModelExpectation(energy_kv=float(first.meta["energy_kv"]),
                            semiangle_mrad=float(first.meta["semiangle_mrad"]), scan_shape=(sy, sx),
                            pattern_px=int(first.cbed.shape[-1]), target_px=int(first.potential.shape[0]),
                            dk_range_inv_A=(0.98 * min(dks), 1.02 * max(dks)),
                            step_range_A=(0.98 * min(steps), 1.02 * max(steps)), source=f"training store {dirs[0]}")


# --------------------------------------------------------------------------------------------
# 3. fitting a scan to a model


def fit_to_model(scan: RawScan, cal: Calibrations, expect: ModelExpectation) -> PreparedScan:
    """Check the physics, resample scan and detector to the model's sampling, cut into tiles.

    Refuses (one line, ExperimentalInputError) what no resampling can fix: another beam energy or
    convergence angle, a detector coarser than the model's or not reaching its extent, a scan
    step coarser than the model saw, or too few scan points for one tile.
    """
    _check_physics("beam energy", cal.energy_kv, expect.energy_kv, "kV", cal.sources["energy_kv"])
    _check_physics("convergence semi-angle", cal.semiangle_mrad, expect.semiangle_mrad, "mrad",
                   cal.sources["semiangle_mrad"])
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


def _check_physics(what: str, have: float, want: float, unit: str, source: str) -> None:
    if abs(have - want) > PHYSICS_RTOL * want:
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
    intensity-conserving rebin (namsa.simulate.overlap_matrix)."""
    from namsa.simulate import overlap_matrix

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


# --------------------------------------------------------------------------------------------
# writing the maps

#: map name -> unit of its values
MAP_UNITS: dict[str, str] = {"potential": "V*Angstrom", "density": "electrons/Angstrom^2",
                             "icom_potential": "V*Angstrom (mean undetermined, set to 0)"}


def is_output_name(name: str) -> bool:
    """Whether ``name`` is a file `write_maps` writes (what an earlier reconstruction may have left)."""
    stem, _, ext = name.rpartition(".")
    return name in ("reconstruction.png", "reconstruction.json") or (stem in MAP_UNITS and ext in ("npy", "tif"))


def check_map_names(names: Sequence[str]) -> None:
    """Only the known map names (`MAP_UNITS`) become file names: a model card's ``targets`` decide
    them, and a name like ``../../x`` or ``/etc/x`` must not place a file outside ``--out``."""
    unknown = [name for name in names if name not in MAP_UNITS]
    if unknown:
        raise ExperimentalInputError(f"the model names an output {unknown[0]!r}, which is not one of the maps namsa "
                                     f"writes ({', '.join(MAP_UNITS)}); its card is damaged or not from namsa: "
                                     "use a model directory written by `namsa train` or a pretrained:NAME")


def write_maps(out_dir: str | Path, maps: Mapping[str, np.ndarray], pixel_A: tuple[float, float],
               info: Mapping[str, Any]) -> dict[str, str]:
    """Write each (H, W) map ([row = y, col = x]) as ``<name>.npy`` and ``<name>.tif`` (float32),
    one figure ``reconstruction.png`` and ``reconstruction.json`` (units, pixel size in Angstrom,
    ``info``). Returns name -> path of everything written. Names outside `MAP_UNITS` are refused
    before anything is written."""
    check_map_names(list(maps))
    try:
        import tifffile
    except ImportError:
        raise ExperimentalInputError("writing the maps as TIFF needs tifffile: pip install -e '.[io]'") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for name, image in maps.items():
        image = np.asarray(image, dtype=np.float32)
        np.save(out / f"{name}.npy", image)
        tifffile.imwrite(out / f"{name}.tif", image, metadata={"unit": MAP_UNITS[name], "axes": "YX"},
                         resolution=(1.0 / pixel_A[1], 1.0 / pixel_A[0]))
        written[f"{name}.npy"], written[f"{name}.tif"] = str(out / f"{name}.npy"), str(out / f"{name}.tif")
    written["reconstruction.png"] = str(_figure(out / "reconstruction.png", maps, pixel_A))
    summary = {"maps": {name: {"unit": MAP_UNITS[name], "shape": list(np.shape(m)), "npy": f"{name}.npy",
                               "tif": f"{name}.tif"} for name, m in maps.items()},
               "pixel_size_A": list(pixel_A), "axes": "[row = y, col = x]", **info}
    (out / "reconstruction.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    written["reconstruction.json"] = str(out / "reconstruction.json")
    return written


def _figure(path: Path, maps: Mapping[str, np.ndarray], pixel_A: tuple[float, float]) -> Path:
    """One panel per map, axes in Angstrom, a colour bar with the map's unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(maps), figsize=(4.2 * len(maps), 3.8), squeeze=False)
    for ax, (name, image) in zip(axes[0], maps.items()):
        h, w = np.shape(image)
        shown = ax.imshow(image, cmap="magma", extent=(0, w * pixel_A[1], h * pixel_A[0], 0))
        ax.set_title(name)
        ax.set_xlabel("x (Angstrom)")
        ax.set_ylabel("y (Angstrom)")
        fig.colorbar(shown, ax=ax, label=MAP_UNITS[name].split(" (")[0])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
