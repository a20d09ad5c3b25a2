"""`SampleMeta`: what a sample's stack and maps were taken with, one typed, frozen record (``Sample.meta``).

The simulator fills every field (`namsa.simulate`); a microscope scan (`namsa reconstruct --refine`'s
tiles) knows only its scan and physics, so every field but the scan's shape and field of view may be
None: a reader that needs one says so (`missing`, or a one-line error of its own), never a KeyError.
The record owns the numbers derived from it (the scan step, the detector's reciprocal sampling, the
iCoM `ScanCalibration`), computed once per record; no other module re-derives them from the fields.

JSON is the stores' form only (`stage.writer` writes `to_json`, `stage.reader` reads `from_json`):
`to_json` gives back exactly the dict `from_json` was given (same keys in the same order, same values;
keys this record does not know are kept in ``extra``), so stored bytes, checksums, sample ids and config
hashes are unchanged, and stores written by any earlier namsa read as they are.

Units are in the field names: Angstrom (``_A``), kV, mrad, electrons / Angstrom^2; axes [y, x].
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .constants import mrad_per_inv_A
from .errors import UserError
from .icom import ScanCalibration, k_sampling_inv_A
from .optics import scan_step_A

#: the fields every simulated sample carries (`namsa.sample.Sample.validate` checks them)
REQUIRED_META_KEYS: tuple[str, ...] = (
    "sample_id", "material_id", "formula", "elements", "zone_axis", "variant", "thickness_A", "energy_kv",
    "semiangle_mrad", "aberrations", "sampling_A", "scan_shape", "scan_positions_A", "fov_A", "seed",
    "code_version", "config_hash",
)


class SampleMetaError(UserError):
    """A stored sample meta lacks its scan or holds a value of the wrong form."""


@dataclass(frozen=True, kw_only=True)
class SampleMeta:
    """A sample's metadata. The fields are declared in the order the simulator writes them (the JSON
    key order of a new store); all but ``scan_shape`` and ``fov_A`` may be None (a microscope scan)."""

    sample_id: str | None = None             # namsa.material_id.sample_id(material, axis, variant, hash)
    material_id: str | None = None           # stable id of the structure (library id, CIF stem, generated id)
    formula: str | None = None               # reduced formula
    prototype: str | None = None             # structure type (AFLOW label); None for a CIF (stage.splits)
    elements: tuple[str, ...] | None = None  # element symbols present, sorted
    zone_axis: tuple[int, ...] | None = None  # [u, v, w]
    variant: int | None = None               # variant index (phonon / tilt / defocus / thickness draw)
    thickness_A: float | None = None         # specimen thickness along the beam (Angstrom)
    energy_kv: float | None = None           # beam energy (kV)
    semiangle_mrad: float | None = None      # probe-forming aperture semi-angle (mrad)
    aberrations: Mapping[str, float] | None = None  # {"C1_A": Angstrom, "C3_mm": mm}
    sampling_A: tuple[float, ...] | None = None     # (dy, dx) simulation grid pixel (Angstrom)
    scan_shape: tuple[int, int]              # (scan_y, scan_x); pattern s at row s // scan_x
    scan_positions_A: tuple[tuple[float, ...], ...] | None = None  # (y, x) probe positions, row-major
    fov_A: tuple[float, float, float, float]  # (y0, x0, height, width) scanned field of view (Angstrom)
    seed: int | None = None                  # the sample's random seed
    code_version: str | None = None          # namsa.__version__ that wrote it
    config_hash: str | None = None           # SimulationConfig.physics_hash()
    cell_A: tuple[float, ...] | None = None  # (Lx, Ly, Lz) supercell (Angstrom)
    gpts: tuple[int, ...] | None = None      # simulation grid (pixels)
    n_slices: int | None = None              # potential slices
    slice_thickness_A: float | None = None   # Angstrom
    tilt_mrad: tuple[float, ...] | None = None  # specimen tilt (mrad)
    frozen_phonon: bool | None = None        # thermal displacements drawn
    dose_e_per_A2: float | None = None       # shot noise as simulated (electrons / Angstrom^2); None: clean
    pattern_dk_inv_A: float | None = None    # detector pixel (1/Angstrom)
    pattern_mrad_per_px: float | None = None  # detector pixel (mrad)
    target_sampling_A: tuple[float, ...] | None = None  # (dy, dx) target map pixel (Angstrom)
    target_fwhm_A: float | None = None       # resolution of the targets: FWHM of their Gaussian (Angstrom)
    phonon_configs: int | None = None        # frozen-phonon configurations averaged
    intensity_kept_min: float | None = None  # least fraction of a probe's intensity inside the patterns
    transmission_bandlimit_loss: float | None = None  # intensity lost to the transmission's band limit
    method: str | None = None                # "multislice" or "periodic"
    strain: float | None = None              # relative strain of the supercell
    #: stored keys this record does not know, kept so that nothing is lost on a round trip
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the JSON key order as read (None: every field in declaration order, as the simulator writes)
    json_keys: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    # ----------------------------------------------------------------------------- the stores' form

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SampleMeta":
        """The record of a stored meta dict (any namsa's: unknown keys go to ``extra``); a
        `SampleMetaError` (one line) when it lacks its scan or a value has the wrong form."""
        if not isinstance(data, Mapping):
            raise SampleMetaError(f"a sample meta is a JSON object, got {type(data).__name__}")
        for name in ("scan_shape", "fov_A"):
            if name not in data:
                raise SampleMetaError(f"sample meta {str(data.get('sample_id'))[:80]!r} lacks {name}")
        try:
            known = {name: _held(name, value) for name, value in data.items() if name in _FIELDS}
        except (TypeError, ValueError) as exc:
            raise SampleMetaError(f"sample meta {str(data.get('sample_id'))[:80]!r}: a value has the wrong form "
                                  f"({exc})") from None
        extra = {name: _frozen(value) for name, value in data.items() if name not in _FIELDS}
        return cls(**known, extra=extra, json_keys=tuple(data))

    def to_json(self) -> dict[str, Any]:
        """The stored dict: exactly what `from_json` read (same keys, order and values), or for a new
        record every field in declaration order (None as null); a field set later is appended."""
        order = self.json_keys if self.json_keys is not None else _FIELDS
        out = {name: self._json_value(name) for name in order if name in _FIELDS or name in self.extra}
        for name in _FIELDS:
            if name not in out and getattr(self, name) is not None:
                out[name] = _stored(name, getattr(self, name))
        for name, value in self.extra.items():
            out.setdefault(name, _thawed(value))
        return out

    def _json_value(self, name: str) -> Any:
        return _stored(name, getattr(self, name)) if name in _FIELDS else _thawed(self.extra[name])

    def __post_init__(self) -> None:
        """Refuse (`SampleMetaError`, one line) a scan that is not (scan_y, scan_x) positive ints over a
        (y0, x0, height, width) field of view of positive size: every derived number divides by them."""
        shape, fov = (tuple(v) if isinstance(v, list) else v for v in (self.scan_shape, self.fov_A))
        object.__setattr__(self, "scan_shape", shape)   # a list given is taken as its tuple
        object.__setattr__(self, "fov_A", fov)
        which = f"sample meta {str(self.sample_id)[:80]!r}"
        if not (isinstance(shape, tuple) and len(shape) == 2 and all(_is_int(n) and n > 0 for n in shape)):
            raise SampleMetaError(f"{which}: scan_shape must be two positive ints, got {shape!r}")
        if not (isinstance(fov, tuple) and len(fov) == 4 and all(_is_number(v) for v in fov) and fov[2] > 0
                and fov[3] > 0):
            raise SampleMetaError(f"{which}: fov_A must be (y0, x0, height, width) with a positive size, got {fov!r}")

    # ----------------------------------------------------------------------------- what is missing

    def missing(self, names: Iterable[str]) -> list[str]:
        """The fields of ``names`` this record does not know (None): what a reader would need."""
        return [name for name in names if getattr(self, name) is None]

    def replace(self, **changes: Any) -> "SampleMeta":
        """A copy with ``changes`` (field values); derived numbers are computed afresh for it."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------------------- derived numbers

    @functools.cached_property
    def scan_step_A(self) -> tuple[float, float]:
        """(dy, dx) probe step (Angstrom): the field of view over the scan shape (`namsa.optics.scan_step_A`)."""
        return scan_step_A(self.fov_A, self.scan_shape)

    @property
    def scan_step_area_A2(self) -> float:
        """dy * dx (Angstrom^2): the area each probe position stands for (a dose's electrons per position)."""
        dy, dx = self.scan_step_A
        return dy * dx

    @functools.cached_property
    def reciprocal_sampling_inv_A(self) -> float | None:
        """The detector pixel (1/Angstrom): ``pattern_dk_inv_A``, else ``pattern_mrad_per_px`` at the
        beam's wavelength; None without either (or without the energy to convert mrad)."""
        if self.pattern_dk_inv_A is not None:
            return float(self.pattern_dk_inv_A)
        if self.pattern_mrad_per_px is not None and self.energy_kv is not None:
            return float(self.pattern_mrad_per_px) / mrad_per_inv_A(float(self.energy_kv))
        return None

    @functools.cached_property
    def angular_sampling_mrad(self) -> float | None:
        """The detector pixel (mrad): ``pattern_mrad_per_px``, else ``pattern_dk_inv_A`` times the
        wavelength; None without either (or without the energy to convert 1/Angstrom)."""
        if self.pattern_mrad_per_px is not None:
            return float(self.pattern_mrad_per_px)
        if self.pattern_dk_inv_A is not None and self.energy_kv is not None:
            return float(self.pattern_dk_inv_A) * mrad_per_inv_A(float(self.energy_kv))
        return None

    @property
    def thickness_or_nan_A(self) -> float:
        """The specimen's thickness (Angstrom); NaN when unknown (a microscope scan)."""
        return math.nan if self.thickness_A is None else float(self.thickness_A)

    @functools.cached_property
    def fov_is_one_period(self) -> bool | None:
        """Whether the field of view (height, width) is the whole supercell ``cell_A`` = (Lx, Ly, Lz), i.e.
        the scan is one period of a periodic specimen; None without a cell (a microscope tile)."""
        if self.cell_A is None:
            return None
        return (math.isclose(float(self.fov_A[2]), float(self.cell_A[1]), rel_tol=1e-6)
                and math.isclose(float(self.fov_A[3]), float(self.cell_A[0]), rel_tol=1e-6))

    @functools.cached_property
    def calibration(self) -> ScanCalibration:
        """The iCoM `ScanCalibration`: the target grid's pixel (0, 0) sits at the field of view's origin
        (namsa.targets), so its shift is the first probe position's offset from it; periodic unless the
        field of view is known not to be one period; the detector in pixel units without its sampling."""
        scan_y, scan_x = (int(v) for v in self.scan_shape)
        y0, x0, height, width = (float(v) for v in self.fov_A)
        first = self.scan_positions_A[0] if self.scan_positions_A else (y0, x0)
        energy = self.energy_kv
        inv_a, mrad = self.pattern_dk_inv_A, self.pattern_mrad_per_px
        k_unit = k_sampling_inv_A(inv_a, mrad, energy)[0] if inv_a is not None or mrad is not None else None
        return ScanCalibration(scan_shape=(scan_y, scan_x), k_sampling_invA=k_unit,
                               energy_kv=None if energy is None else float(energy),
                               scan_step_A=(height / scan_y, width / scan_x),
                               shift_frac=((y0 - float(first[0])) / height, (x0 - float(first[1])) / width),
                               periodic=self.fov_is_one_period is not False)


#: the JSON keys this record owns, in declaration order
_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SampleMeta) if f.name not in ("extra", "json_keys"))


#: the fields held as a flat tuple, a tuple of (y, x) tuples and a dict (stored as lists and an object)
_FLAT = frozenset({"elements", "zone_axis", "sampling_A", "scan_shape", "fov_A", "cell_A", "gpts", "tilt_mrad",
                   "target_sampling_A"})
_NESTED = frozenset({"scan_positions_A"})
_MAPPING = frozenset({"aberrations"})


def _converted(name: str, value: Any, sequence: type) -> Any:
    """A field's value with its lists (or tuples) made ``sequence``: tuple to hold it (`_held`), list to
    store it (`_stored`). No number is converted, so a value read is stored back exactly."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    if name in _FLAT:
        return sequence(value)
    if name in _NESTED:
        return sequence(map(sequence, value))
    if name in _MAPPING:
        return dict(value)
    return value


def _held(name: str, value: Any) -> Any:
    """A field's stored JSON value as the record holds it (lists as tuples)."""
    return _converted(name, value, tuple)


def _stored(name: str, value: Any) -> Any:
    """A field's value in the stores' JSON form (tuples as lists): the inverse of `_held`."""
    return _converted(name, value, list)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _frozen(value: Any) -> Any:
    """A JSON value of ``extra`` with every list a tuple (dicts copied): what a frozen record may hold."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def _thawed(value: Any) -> Any:
    """The JSON form of an ``extra`` value: every tuple a list, dicts copied (what the stores hold)."""
    if isinstance(value, (list, tuple)):
        return [_thawed(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    return value


__all__ = ["SampleMeta", "SampleMetaError", "REQUIRED_META_KEYS"]
