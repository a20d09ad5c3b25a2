"""Calibrations of a scan: units in a file's metadata and their resolution against the command line."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from namsa.constants import wavelength_A

from .errors import ExperimentalInputError

#: calibration name -> (what it is, the command-line flag that gives it)
FLAGS: dict[str, tuple[str, str]] = {
    "energy_kv": ("beam energy (kV)", "--energy-kv"),
    "semiangle_mrad": ("convergence semi-angle (mrad)", "--semiangle-mrad"),
    "dk_inv_A": ("detector pixel size (1/Angstrom or mrad)", "--dk-inv-a (or --dk-mrad)"),
    "step_A": ("scan step (Angstrom)", "--scan-step-a")}
#: length units -> Angstrom; reciprocal units -> 1/Angstrom
_LENGTH = {"a": 1.0, "å": 1.0, "angstrom": 1.0, "nm": 10.0, "pm": 0.01, "um": 1e4, "µm": 1e4, "μm": 1e4,
           "m": 1e10, "meters": 1e10}
_RECIPROCAL = {"1/a": 1.0, "1/å": 1.0, "a^-1": 1.0, "å^-1": 1.0, "1/angstrom": 1.0, "1/nm": 0.1, "nm^-1": 0.1,
               "1/m": 1e-10, "1/meters": 1e-10}
#: metadata paths of the beam energy (kV) and convergence semi-angle (mrad) in HyperSpy's tree
_TEM_KEYS = {"Acquisition_instrument.TEM.beam_energy": "energy_kv",
             "Acquisition_instrument.TEM.convergence_angle": "semiangle_mrad"}
_ANGLE = {"mrad": 1.0, "rad": 1e3}
#: beam energies (kV) electron microscopes reach: SEM-based 4D-STEM from a few kV to the 3 MV of
#: the largest high-voltage TEMs; outside it the number is in another unit (eV, V) or wrong
ENERGY_RANGE_KV = (1.0, 3000.0)


@dataclass
class Calibrations:
    """Calibrations used: energy (kV), semi-angle (mrad), detector pixel (dky, dkx) 1/Angstrom,
    scan step (dy, dx) Angstrom, and where each came from (``sources``: name -> text)."""

    energy_kv: float
    semiangle_mrad: float
    dk_inv_A: tuple[float, float]
    step_A: tuple[float, float]
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_known(cls, known: Mapping[str, Any]) -> "Calibrations":
        """The calibrations of a `known_calibrations` result that `missing_calibrations` passed."""
        return cls(energy_kv=known["energy_kv"], semiangle_mrad=known["semiangle_mrad"],
                   dk_inv_A=known["dk_inv_A"], step_A=known["step_A"], sources=known["sources"])


def calibrations_in(signal: Mapping[str, Any]) -> dict[str, Any]:
    """Calibrations stored in an rsciio signal dict: beam energy (kV) and convergence semi-angle
    (mrad) from HyperSpy's ``Acquisition_instrument.TEM.beam_energy`` / ``convergence_angle``,
    from the reader's ``mapping`` of its original metadata to those names (a blockfile's
    ``Beam_energy`` in V, a TIA file's ``High_tension_kV``: what HyperSpy itself would show), or
    the same names among an EMD file's ``microscope`` attributes; and the axis scales with their
    units (axes 0, 1: scan step in a length unit, its sign kept; axes 2, 3: detector pixel in
    1/length or mrad / rad). Axes without a recognised unit give nothing."""
    found = _mapped(signal)
    tem = signal.get("metadata", {}).get("Acquisition_instrument", {}).get("TEM", {})
    microscope = signal.get("original_metadata", {}).get("microscope", {})  # EMD (NCEM) root attributes
    for key, name in (("beam_energy", "energy_kv"), ("convergence_angle", "semiangle_mrad")):
        for where in (tem, microscope):
            if name not in found and _positive(where.get(key)):
                found[name] = float(where[key])
    axes = sorted(signal.get("axes", []), key=lambda a: a.get("index_in_array", 0))
    if len(axes) == 4:
        found.update(_axis_pair(axes[:2], _LENGTH, "step_A", signed=True))
        found.update(_axis_pair(axes[2:], _RECIPROCAL, "dk_inv_A"))
        found.update(_axis_pair(axes[2:], _ANGLE, "dk_mrad"))
    return found


def _mapped(signal: Mapping[str, Any]) -> dict[str, float]:
    """Energy / semi-angle from the original metadata through the reader's ``mapping``
    ({original.path: (hyperspy.path, convert or None)}), as HyperSpy applies it on loading."""
    found: dict[str, float] = {}
    for source, (target, convert) in (signal.get("mapping") or {}).items():
        name = _TEM_KEYS.get(target)
        value = _lookup(signal.get("original_metadata") or {}, source)
        try:
            value = convert(value) if convert is not None and value is not None else value
        except Exception:  # a foreign value the converter cannot take: not a calibration
            continue
        if name and name not in found and _positive(value):
            found[name] = float(value)
    return found


def _lookup(tree: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` in a nested dict; a space in a key matches ``_`` (HyperSpy's
    metadata browser renames TIA's ``High tension_kV`` to ``High_tension_kV``)."""
    for part in dotted.split("."):
        if not isinstance(tree, Mapping):
            return None
        keys = {str(k).replace(" ", "_"): k for k in tree}
        if part not in keys:
            return None
        tree = tree[keys[part]]
    return tree


def _axis_pair(axes: Sequence[Mapping[str, Any]], units: Mapping[str, float], name: str,
               signed: bool = False) -> dict[str, Any]:
    """{name: (y, x) scale in the table's unit} when both axes carry a unit of the table;
    ``signed``: a negative scale is kept (a flipped scan axis), else refused like zero."""
    values = []
    for axis in axes:
        unit = str(axis.get("units") or "").strip().lower().replace(" ", "")
        scale = axis.get("scale")
        if unit not in units or not _positive(abs(float(scale)) if signed and _finite(scale) else scale):
            return {}
        values.append(float(scale) * units[unit])
    return {name: tuple(values)}


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _positive(value: Any) -> bool:
    try:
        return math.isfinite(float(value)) and float(value) > 0
    except (TypeError, ValueError):
        return False


def resolve_calibrations(found: Mapping[str, Any], given: Mapping[str, Any],
                         fitted: Mapping[str, Any] | None = None) -> Calibrations:
    """The calibrations to use: ``given`` (command line; None = not given) wins over ``found`` (file),
    which wins over ``fitted`` (measured from the patterns, stage.microscope.autocal).

    given keys: energy_kv, semiangle_mrad, dk_inv_A, dk_mrad, step_A (scalars or (y, x) pairs).
    A detector pixel in mrad is converted to 1/Angstrom with the beam energy (k = theta / lambda).
    """
    known = known_calibrations(found, given, fitted)
    missing = missing_calibrations(known)
    if missing:
        raise ExperimentalInputError(missing)
    check_energy(found, given)
    return Calibrations.from_known(known)


def known_calibrations(found: Mapping[str, Any], given: Mapping[str, Any],
                       fitted: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What `resolve_calibrations` would use, for the calibrations that are there (the others are
    absent): energy_kv (kV), semiangle_mrad (mrad), dk_inv_A ((y, x) 1/Angstrom), step_A ((y, x)
    Angstrom, signed), and ``sources`` (name -> where it came from). A value that is no number is
    refused in one line naming its flag."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in ("energy_kv", "semiangle_mrad", "dk_inv_A", "dk_mrad", "step_A"):
        if given.get(name) is not None:
            values[name], sources[name] = given[name], "command line"
        elif found.get(name) is not None:
            values[name], sources[name] = found[name], "file metadata"
        elif (fitted or {}).get(name) is not None:
            values[name], sources[name] = fitted[name], "from the data (fit)"
    if "dk_inv_A" in values and "dk_mrad" in values and sources["dk_inv_A"] != sources["dk_mrad"]:
        values.pop("dk_mrad" if sources["dk_inv_A"] == "command line" else "dk_inv_A")
    known: dict[str, Any] = {}
    for name, flag in (("energy_kv", "--energy-kv"), ("semiangle_mrad", "--semiangle-mrad")):
        if name in values:
            known[name] = _scalar(values[name], flag)
    if "dk_inv_A" in values:
        known["dk_inv_A"] = _pair(values["dk_inv_A"], "--dk-inv-a")
    elif "dk_mrad" in values and "energy_kv" in known:
        lam = wavelength_A(known["energy_kv"])
        known["dk_inv_A"] = tuple(v * 1e-3 / lam for v in _pair(values["dk_mrad"], "--dk-mrad"))
        sources["dk_inv_A"] = f"{sources['dk_mrad']} (mrad, converted at {known['energy_kv']:g} kV)"
    if "step_A" in values:
        known["step_A"] = _signed_step(values["step_A"], sources, found.get("step_A"))
    known["sources"] = {k: v for k, v in sources.items() if k in known}
    known["dk_mrad_given"] = "dk_mrad" in values  # a pixel in mrad waits for the energy to be converted
    return known


def missing_calibrations(known: Mapping[str, Any]) -> str | None:
    """Every calibration `known_calibrations` lacks, named in one line with its flag so one run
    tells all; None when none is missing."""
    have = set(known) | ({"dk_inv_A"} if known.get("dk_mrad_given") else set())
    missing = [name for name in FLAGS if name not in have]
    if not missing:
        return None
    listed = "; ".join(f"{FLAGS[n][0]} ({FLAGS[n][1]})" for n in missing)
    return (f"the file's metadata lacks {len(missing)} calibration(s): {listed}; give "
            f"{'it' if len(missing) == 1 else 'them'} on the command line")


def _signed_step(value: Any, sources: dict[str, str], in_file: Any) -> tuple[float, float]:
    """The scan step (y, x): the file's own keeps its sign; a step given on the command line is a
    length and takes the sign of the file's axis when the file has one (its orientation)."""
    if sources["step_A"] == "file metadata":
        return _pair(value, "--scan-step-a", signed=True)
    step = _pair(value, "--scan-step-a")
    if in_file is None:
        return step
    signs = [math.copysign(1.0, float(v)) for v in _pair(in_file, "the file's scan step", signed=True)]
    if -1.0 in signs:
        sources["step_A"] = "command line (sign of the file's axis kept)"
    return step[0] * signs[0], step[1] * signs[1]


def check_energy(found: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """The beam energy to be used (given, else found) lies in `ENERGY_RANGE_KV`; checked before the
    patterns are looked at, so an energy in V is named as such rather than blamed on the disc."""
    source = "command line (--energy-kv)" if given.get("energy_kv") is not None else "file metadata"
    value = given.get("energy_kv") if given.get("energy_kv") is not None else found.get("energy_kv")
    if value is None:
        return  # resolve_calibrations names what is missing
    kv = _scalar(value, "--energy-kv")
    low, high = ENERGY_RANGE_KV
    if not low <= kv <= high:
        hint = f" (is it in V? that is {kv / 1e3:g} kV)" if kv > high else ""
        raise ExperimentalInputError(f"the beam energy {kv:g} kV ({source}) is outside the {low:g}-{high:g} kV "
                                     f"electron microscopes use{hint}; give the right one with --energy-kv")


def _scalar(value: Any, flag: str) -> float:
    if not _positive(value):
        raise ExperimentalInputError(f"{flag} must be a positive number, got {value!r}")
    return float(value)


def _pair(value: Any, flag: str, signed: bool = False) -> tuple[float, float]:
    """(y, x) from one number or a pair; ``signed``: negative values pass (a file's flipped axis)."""
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
    arr = np.repeat(arr, 2) if arr.size == 1 else arr
    if arr.size != 2 or not all(_positive(abs(v) if signed else v) for v in arr):
        raise ExperimentalInputError(f"{flag} must be one positive number or a (y, x) pair, got {value!r}")
    return float(arr[0]), float(arr[1])

