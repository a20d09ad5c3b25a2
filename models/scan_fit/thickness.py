"""Specimen thickness from a scan's position-averaged pattern (PACBED), against references simulated
with the model's own physics (`models.scan_fit.thickness_reference`, stored beside a shipped model as
``thickness_reference.safetensors``).

**What carries thickness here.** The patterns `namsa reconstruct` feeds a model are divided by their
mean total, so the intensity lost past the detector (`stage.scan_statistics.high_angle_loss`) is gone,
and elastic (Bragg) scattering saturates within an extinction distance (~20-60 Angstrom). What keeps
growing with thickness is thermal diffuse scattering (TDS): a smooth tail at high angles, about
proportional to thickness x the specimen's scattering strength. The estimator reads the shape of the
PACBED's radial tail: the fraction of the intensity outside each radius (``RADII_MRAD``, of that
inside ``NORM_MRAD``, on a log scale), which gain, dose and the per-tile normalisation leave alone.

**Against what.** The file's material is unknown, so the profile is matched against every material of
the reference set (library structures of the training families, light to heavy, each with one
frozen-phonon configuration, 10 to 300 Angstrom: twice the shipped models' 150). Each reference's best
depth is read; every reference whose best match is within ``ACCEPT_FACTOR`` of the best one's residual
is an acceptable explanation; the estimate is their depths' mean weighted by fit, their span its range,
widened by ``MARGIN`` (leave-one-material-out over the set: benchmarks/thickness_validation.py). A thin heavy and a
thick light crystal can still look alike: the range says how far the data leave that open; a best match
at the set's deepest entry is "at least" that deep.

**When the specimen is known** (``namsa reconstruct --specimen NiO-rocksalt --zone-axis 0,1,1``: a
`models.scan_fit.thickness_reference.KnownSpecimen`), the profile is matched against that material's own
series alone, simulated on the spot: the classical PACBED thickness measurement, without the doubt between
materials (within `OWN_MARGIN` on the validation's specimens, flagged beyond `OWN_FLAG_ABOVE`). A named
specimen whose best match is worse than `MAX_OWN_RESIDUAL` is not what the scan shows: that is a finding,
and the estimate falls back to the reference set.

**Without TDS** (a simulation without frozen phonons, 90% of the study's training samples) the tail
does not grow and thickness beyond ~50 Angstrom is not readable from a PACBED at all; real specimens
always carry TDS.

Axis order: a stack is (S, P, P) = (scan position, ky, kx), k = 0 at pixel P // 2 (namsa's convention;
`namsa reconstruct` recentres file patterns to it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from namsa.errors import NamsaError
from stage.microscope.disc import find_disc

from ..errors import ModelDirError
from ..safe_files import open_regular
from .trained_ranges import trained_ranges

#: radii (mrad) at which the outside fraction is read, and the radius whose inside total is 1: the
#: smallest detector of the study's physics reaches 69.7 mrad (k_max = band_limit / (2 x 0.12 A))
RADII_MRAD = np.arange(6.0, 66.0, 3.0)
NORM_MRAD = 66.0
#: added to the outside fraction before the log: below this the tail is float noise
TAIL_FLOOR = 1e-4
#: each pixel is split into this many sub-pixels per axis for the encircled intensity (smooths pixel edges)
SUBPIXELS = 4
#: references whose best residual is within this factor (plus ``ACCEPT_FLOOR``) of the best one's explain
#: the data as well, within the spread of the set (chosen on the set's leave-one-material-out cases)
ACCEPT_FACTOR = 2.0
ACCEPT_FLOOR = 1e-3
#: the accepted depths' range widened by this fraction either way (leave-one-material-out: see the docs)
MARGIN = 0.25
#: the estimate's median relative error when the material is not in the set (leave-one-material-out over
#: the shipped set: 0.31, docs): an estimate above the training range's top by more than this is flagged
FLAG_ABOVE = 0.33
#: with the specimen named, its own series' error (benchmarks/thickness_validation.py --known, 18 scans of
#: 6 materials outside the set at 60-300 A: median |error| 0.04, largest 0.17): the range's margin, and the
#: flag's margin above the training top (a 150 A specimen read up to 170 A; every 300 A one 290-300 A)
OWN_MARGIN = 0.2
OWN_FLAG_ABOVE = 0.2
#: a named specimen's best residual above this: the scan is not that material down that axis (the same
#: validation: an own match leaves at most 0.006; a wrong name, 0.001-0.25, median 0.016: a similar
#: material or the same one down another axis can match as well, so only a clearly different one is caught)
MAX_OWN_RESIDUAL = 1e-2
#: the reference file beside a model, its size cap (bytes) and its format version
REFERENCE_FILE = "thickness_reference.safetensors"
MAX_REFERENCE_BYTES = 4 << 20
REFERENCE_VERSION = 1
#: the physics fields a reference must share with a card's ``expects_input`` to be used for it
PHYSICS_FIELDS = ("energy_kv", "semiangle_mrad", "sampling_A", "band_limit", "pattern_px")
#: where the shipped references live (searched when the model's own directory has none)
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "pretrained"


@dataclass(frozen=True)
class ThicknessReference:
    """``profiles`` (M, D, R): the `tail_profile` of material m at depth ``depths_A[d]`` (Angstrom);
    ``names`` (M,): "material|zone axis"; ``physics``: the simulation fields it was made with."""

    names: list[str]
    depths_A: np.ndarray
    profiles: np.ndarray
    physics: dict[str, Any]

    def mismatch(self, expects: Any) -> str:
        """'' when the card's ``expects_input`` has this reference's physics, else what differs."""
        for name in PHYSICS_FIELDS:
            ours, theirs = self.physics.get(name), getattr(expects, name, None)
            if ours is None or theirs is None or not np.isclose(float(ours), float(theirs), rtol=1e-6):
                return f"the reference was simulated at {name} = {ours}, the model expects {theirs}"
        return ""


@dataclass(frozen=True)
class ThicknessEstimate:
    """``value_A``: the acceptable references' depths (Angstrom), geometric mean weighted by 1 / residual;
    ``low_A``..``high_A``: the range every acceptable
    reference gives, widened by a margin (`MARGIN`, `OWN_MARGIN`); ``at_least``: the best match is the set's
    deepest entry, so the specimen may be thicker still; ``nearest``: the best-matching reference;
    ``accepted``: how many agree; ``residual``: the best match's mean squared log difference."""

    value_A: float
    low_A: float
    high_A: float
    at_least: bool
    nearest: str
    accepted: int
    residual: float

    def said(self) -> str:
        """The estimate in words, e.g. "about 280 A (170-380)" or "at least 300 A"."""
        if self.at_least:
            return f"at least {self.low_A:.0f} A (best match {self.value_A:.0f} A or deeper)"
        return f"about {self.value_A:.0f} A ({self.low_A:.0f}-{self.high_A:.0f})"


def position_averaged(cbed: np.ndarray) -> np.ndarray:
    """The (P, P) mean of a (S, P, P) stack (a (P, P) pattern is returned as float64)."""
    a = np.asarray(cbed, dtype=np.float64)
    return a.mean(axis=0) if a.ndim == 3 else a


def tail_profile(pacbed: np.ndarray, mrad_per_px: float) -> np.ndarray:
    """(R,) log(outside fraction + `TAIL_FLOOR`) of a (P, P) pattern at `RADII_MRAD`: the intensity beyond
    each radius over that inside `NORM_MRAD`, k = 0 at pixel P // 2, ``mrad_per_px`` the detector pixel."""
    p = np.asarray(pacbed, dtype=np.float64)
    offsets = (np.arange(SUBPIXELS) + 0.5) / SUBPIXELS - 0.5
    fine_y = ((np.arange(p.shape[0]) - p.shape[0] // 2)[:, None] + offsets).ravel()
    fine_x = ((np.arange(p.shape[1]) - p.shape[1] // 2)[:, None] + offsets).ravel()
    radius = np.hypot(fine_y[:, None], fine_x[None, :]) * mrad_per_px
    weight = np.repeat(np.repeat(p, SUBPIXELS, axis=0), SUBPIXELS, axis=1)
    edges = np.append(RADII_MRAD, NORM_MRAD)
    ring = np.searchsorted(edges, radius.ravel(), side="right")
    inside = np.cumsum(np.bincount(ring, weights=weight.ravel(), minlength=len(edges) + 1)[:len(edges)])
    return np.log(1.0 - inside[:-1] / inside[-1] + TAIL_FLOOR)


def _unusable(pacbed: np.ndarray) -> str:
    """Why a (P, P) pattern has no thickness to read ('' when it has)."""
    if pacbed.ndim != 2 or pacbed.shape[0] != pacbed.shape[1]:
        return f"the patterns are {pacbed.shape}, not square (P, P)"
    if not np.all(np.isfinite(pacbed)) or np.any(pacbed < 0):
        return "the patterns hold negative or non-finite values"
    if not pacbed.sum() > 0:
        return "the patterns carry no intensity"
    if find_disc(pacbed) is None:
        return "the mean pattern shows no bright-field disc"
    return ""


def estimate_thickness(cbed: np.ndarray, reference: ThicknessReference, mrad_per_px: float, margin: float = MARGIN
                       ) -> ThicknessEstimate | str:
    """The thickness (Angstrom) of a (S, P, P) stack or (P, P) PACBED with detector pixel ``mrad_per_px``,
    matched against ``reference`` (see the module docstring), its range widened by ``margin``; a one-line
    reason when there is none."""
    pacbed = position_averaged(cbed)
    reason = _unusable(pacbed)
    if reason:
        return reason
    if pacbed.shape[0] // 2 * mrad_per_px < NORM_MRAD:
        return (f"the detector reaches {pacbed.shape[0] // 2 * mrad_per_px:.0f} mrad from k = 0, short of the "
                f"{NORM_MRAD:g} mrad the estimate reads")
    return match_profile(tail_profile(pacbed, mrad_per_px), reference, margin)


def match_profile(profile: np.ndarray, reference: ThicknessReference, margin: float = MARGIN) -> ThicknessEstimate:
    """The estimate of an (R,) `tail_profile` against every material of ``reference`` (module docstring), its
    range widened by ``margin`` either way."""
    residual = ((reference.profiles - profile) ** 2).mean(axis=-1)   # (M, D): mean squared log difference
    best_depth, best_residual = residual.argmin(axis=1), residual.min(axis=1)
    winner = int(best_residual.argmin())
    ok = best_residual <= ACCEPT_FACTOR * best_residual[winner] + ACCEPT_FLOOR
    depths = reference.depths_A[best_depth[ok]]
    weights = 1.0 / (best_residual[ok] + ACCEPT_FLOOR)   # the better a material explains the data, the more it counts
    value = float(np.exp(np.sum(weights * np.log(depths)) / weights.sum()))
    at_least = bool(best_depth[winner] == len(reference.depths_A) - 1)
    low = float(depths.min()) / (1 + margin)
    high = float(depths.max()) * (1 + margin)
    return ThicknessEstimate(value, low, high, at_least, reference.names[winner], int(ok.sum()),
                             float(best_residual[winner]))


def load_reference(path: str | Path) -> ThicknessReference:
    """A reference file (safetensors: ``depths_A`` (D,), ``profiles`` (M, D, R); metadata ``names``,
    ``physics``, ``radii_mrad``, ``version`` as JSON), read without following links and size-capped;
    one-line `ModelDirError` when it is not one this code can use."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    where = f"thickness reference {path}"
    with open_regular(path, "thickness reference") as fh:
        raw = fh.read(MAX_REFERENCE_BYTES + 1)
    if len(raw) > MAX_REFERENCE_BYTES:
        raise ModelDirError(f"{where} is larger than {MAX_REFERENCE_BYTES} bytes; it is not a thickness reference")
    try:
        arrays, header = load(raw), _metadata(raw)   # the file's JSON header, not a sample's meta
        names, physics = json.loads(header["names"]), json.loads(header["physics"])
        radii, version = json.loads(header["radii_mrad"]), int(header["version"])
        depths, profiles = arrays["depths_A"].astype(np.float64), arrays["profiles"].astype(np.float64)
    except (SafetensorError, KeyError, ValueError, TypeError) as exc:
        raise ModelDirError(f"{where} is damaged or not a thickness reference ({str(exc)[:80]})") from None
    if version != REFERENCE_VERSION or not np.allclose(radii, RADII_MRAD):
        raise ModelDirError(f"{where} was written for other radii or version {version}; rebuild it with "
                            "scripts/build_thickness_reference.py")
    if profiles.shape != (len(names), len(depths), len(RADII_MRAD)) or not np.all(np.isfinite(profiles)):
        raise ModelDirError(f"{where} holds profiles of shape {profiles.shape} for {len(names)} materials and "
                            f"{len(depths)} depths, or non-finite values; it is damaged")
    return ThicknessReference(list(names), depths, profiles, dict(physics))


def _metadata(raw: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors byte string (its header is a length-prefixed JSON object)."""
    length = int.from_bytes(raw[:8], "little")
    if not 0 < length <= len(raw) - 8:
        raise ValueError("the header length runs past the file")
    return dict(json.loads(raw[8:8 + length]).get("__metadata__") or {})


def find_reference(card: Any, model_dir: str | Path | None = None) -> ThicknessReference | str:
    """The reference for ``card``: the model directory's own `REFERENCE_FILE`, else a shipped one made with
    the physics of the card's ``expects_input``; a one-line reason when there is none."""
    expects = getattr(card, "expects_input", None)
    if expects is None:
        return "the card has no expects_input: the physics to compare with is unknown"
    candidates = ([Path(model_dir) / REFERENCE_FILE] if model_dir is not None else []) + \
        sorted(SHIPPED_DIR.glob(f"*/{REFERENCE_FILE}"))
    reasons = []
    for path in candidates:
        if not path.exists():
            continue
        reference = load_reference(path)
        why = reference.mismatch(expects)
        if not why:
            return reference
        reasons.append(why)
    return ("no thickness reference simulated with this model's physics" +
            (f" ({reasons[0]})" if reasons else "") + "; build one with scripts/build_thickness_reference.py")


#: the unit of the thickness measurement
THICKNESS_UNIT = "Angstrom"
#: the finding's code and what it tells the user to do
WARNING_CODE = "thickness-outside-training"
ADVICE = ("its maps are not trustworthy here (a thicker specimen's potential comes out too low): image a thinner "
          "region or use a model trained on thicker specimens")


def disc_mrad_per_px(cbed: np.ndarray, semiangle_mrad: float) -> float | None:
    """The detector pixel (mrad) the bright-field disc implies: the semi-angle over its radius (px)."""
    disc = find_disc(position_averaged(cbed))
    return None if disc is None or disc.radius_px <= 0 else float(semiangle_mrad) / disc.radius_px


def check_thickness(report: dict[str, Any], cbed: np.ndarray, card: Any, mrad_per_px: float | None = None,
                    model_dir: str | Path | None = None, specimen: Any = None,
                    reference: ThicknessReference | None = None) -> ThicknessEstimate | None:
    """Record the thickness of a (S, P, P) stack or its (P, P) PACBED (`estimate_thickness`) in ``report``
    ("thickness_A", Angstrom, with its range, the training range and the method) and warn (`WARNING_CODE`)
    when the estimate lies above the card's training thickness by more than its typical error, or all of its
    range does. ``mrad_per_px``: the patterns' detector pixel; None reads it from the disc radius and the
    card's semi-angle. ``specimen``: a `KnownSpecimen` (its own series is simulated, or ``reference`` given
    is used; a scan that does not match it is a "specimen-mismatch" finding and the reference set is used
    instead). Returns the estimate (None with a note)."""
    from stage.microscope.check_report import add_measurement

    trained_range = trained_ranges(card).thickness_A
    trained = None if trained_range is None else trained_range.span()
    if mrad_per_px is None and getattr(card, "expects_input", None) is not None:
        mrad_per_px = disc_mrad_per_px(cbed, card.expects_input.semiangle_mrad)
    found, method, flag_above = _estimate(report, cbed, card, mrad_per_px, model_dir, specimen, reference)
    context = {"training_range": list(trained) if trained else None, "method": method}
    if isinstance(found, str):
        add_measurement(report, "thickness_A", None, THICKNESS_UNIT, note=f"not estimated: {found}", **context)
        return None
    add_measurement(report, "thickness_A", found.value_A, THICKNESS_UNIT, range=[found.low_A, found.high_A],
                    at_least=found.at_least, nearest_reference=found.nearest, references_agreeing=found.accepted,
                    residual=found.residual, mrad_per_px=mrad_per_px, **context)
    if trained is not None and (found.value_A > trained[1] * (1 + flag_above) or found.low_A > trained[1]):
        from stage.microscope.check_report import add_warning

        add_warning(report, WARNING_CODE, f"the specimen is {found.said()} thick by its {method}, outside the "
                                          f"{trained[0]:g}-{trained[1]:g} A the model was trained on: {ADVICE}")
    return found


#: the method of the material-agnostic estimate, as the finding and the record name it
SET_METHOD = "PACBED's diffuse scattering (matched against the reference set)"


def _estimate(report: dict[str, Any], cbed: np.ndarray, card: Any, mrad_per_px: float | None, model_dir: Any,
              specimen: Any, reference: ThicknessReference | None) -> tuple[ThicknessEstimate | str, str, float]:
    """(the estimate or why there is none, its method in words, its flag margin): against the named
    specimen's own series when it matches (module docstring), else against the reference set."""
    if mrad_per_px is None:
        return "no detector pixel: no calibration and no disc", SET_METHOD, FLAG_ABOVE
    if specimen is not None and getattr(card, "expects_input", None) is not None:
        found = _against_specimen(report, cbed, card, mrad_per_px, specimen, reference)
        if found is not None:
            return found, f"PACBED matched to a simulated thickness series of {specimen.name}", OWN_FLAG_ABOVE
    set_reference = find_reference(card, model_dir)
    if isinstance(set_reference, str):
        return set_reference, SET_METHOD, FLAG_ABOVE
    return estimate_thickness(cbed, set_reference, mrad_per_px), SET_METHOD, FLAG_ABOVE


def _against_specimen(report: dict[str, Any], cbed: np.ndarray, card: Any, mrad_per_px: float, specimen: Any,
                      reference: ThicknessReference | None) -> ThicknessEstimate | str | None:
    """The estimate against the named specimen's own series (``reference``, else simulated now), or None with
    a "specimen-mismatch" finding when it cannot be simulated or the scan does not match it."""
    from stage.microscope.check_report import add_warning

    try:   # this runs after the whole scan's inference: a specimen that cannot be simulated must not lose the maps
        own = reference or specimen.reference(card.expects_input.simulation_config())
    except NamsaError as exc:
        add_warning(report, "specimen-mismatch", f"{specimen.name} could not be simulated ({str(exc)[:200]}): the "
                                                 "thickness is estimated against the reference set instead")
        return None
    found = estimate_thickness(cbed, own, mrad_per_px, OWN_MARGIN)
    if isinstance(found, str) or found.residual <= MAX_OWN_RESIDUAL:
        return found
    add_warning(report, "specimen-mismatch", f"the PACBED does not match {specimen.name} at any thickness (residual "
                                             f"{found.residual:.2g}, above the {MAX_OWN_RESIDUAL:g} a match leaves): "
                                             "check --specimen and --zone-axis; the thickness is estimated against "
                                             "the reference set instead")
    return None
