"""Cheap statistics of one 4D-STEM stack that tell data a model has seen from data it has not:
the probe's defocus from the bright-field parallax, the scattered fraction and high-angle loss that
grow with thickness, and the dose its shot noise implies; and their ranges over a store's split.

A stack is (S, P, P) = (scan_y * scan_x, row = ky, col = kx) intensities, each pattern normalised so
the incident probe carries 1 (namsa.sample). Numpy only; `split_ranges` reads stores.

**Defocus from the parallax** (the relation py4DSTEM's parallax reconstruction fits): with a
defocused probe, the image a single bright-field detector pixel at beam angle alpha (rad) records over
the scan is the specimen shifted by C1 * alpha (Angstrom). Undoing the shift of every pixel's image
for a trial C1 and summing them is the tilt-corrected bright-field image; the trial at which it has
the most contrast is the estimate. Near focus the two halves of the disc image the phase gradient
with opposite signs and cancel in a plain sum, so each half (relative to every spatial frequency q)
is summed on its own. A specimen is imaged from its middle, so the estimate is the focus relative
to the specimen's mid-plane: namsa's C1_A (set at the entrance surface, + = overfocus) + thickness / 2.

Accuracy, measured on namsa simulations at the study's physics (200 kV, 20 mrad, 32 px patterns,
32 x 32 scan over one 12-16 Angstrom supercell): 40 library materials on random zone axes, 10-80
Angstrom thick, mid-plane focus uniform in -200..200 Angstrom, were all within `DEFOCUS_TOL_A` +
`DEFOCUS_TOL_REL` x |focus| (RMS error 17 Angstrom; the largest, 49, near focus, where the shifts
vanish), and so were scans of an 11 Angstrom window that is no whole number of periods (as the tiles
`namsa reconstruct` cuts from a specimen); tests/test_input_report.py checks both. Through thicker crystals channelling breaks the shift
picture: at 80-150 Angstrom 28 of 30 were within it, at 300 Angstrom the estimate means nothing. A
crystal whose lattice shifts by a whole period between neighbouring detector pixels (~4.6 mrad here)
aliases to a focus some 400-600 Angstrom away (one of those 30, a spinel); the search spans
+-`search_range_A` (~+-400 Angstrom here).

**Outside the search window** a crystal's reading wraps: the images of neighbouring detector pixels are
shifted by more than a lattice period, and the search finds the focus modulo it, anywhere inside the
window (a +3000 Angstrom focus has read as 6 Angstrom). Such a stack is reported as outside the
window (`DefocusEstimate.outside`, no value) when the focus curve peaks at the window's edge, or when
the strongest frequencies running along the scan's y and those along its x each read the focus on
their own and the two readings differ by more than the sum of their stated accuracies, unless each
direction's curve peaks (nearly) as high at the other's reading: inside the window both read the one
focus, a wrapped focus wraps with each direction's own lattice period. A lattice that repeats alike
along y and x (most cubic crystals down [001]) gives both directions the same aliases of the focus
(below), inside the window and beyond it, and which of them is highest can differ between the two by
a hair: README's own Si [001] at focus read -277 along y and +26 along x, each among the other's
aliases, and was told its focus lay outside. Such readings are one aliased reading, not a wrap: the
parallax alone cannot tell a focus beyond the window from one inside on such a lattice. Measured on
namsa simulations at the flagship's physics (`benchmarks/parallax_window_study.py`, 2026-12-06; a
finding with the probe step given; before -> after this rule):

- random library materials and zone axes, 10-150 Angstrom, focus inside the training range (40 scans):
  0 -> 0 findings; README's Si [001]: 1 -> 0; focus 500-4000 Angstrom either way (30): 20 -> 17 caught;
- the library's cubic materials down [001] (``--cubic --axis 0,0,1``): in focus (30 scans) 1 -> 0 (a
  141 Angstrom Si [001]); focus 500-4000 Angstrom (30): 10 -> 8 caught.

The catches given up were the same toss as the false alarms: a far focus gives such a lattice equal
peaks, and the y and x frequencies happened to pick different ones. Scans in focus are what the model is
given (the flagship's 366 test samples all are; `benchmarks/input_report_false_alarms.py`), so a toss
there costs a correct map its trust; a far focus whose readings are aliases is recorded with them and, one
of them inside the training range, not judged (the note says so).

The same aliasing works
inside the window: a thin cubic crystal whose lattice shifts by a whole period between neighbouring detector
pixels gives the focus curve two peaks of (nearly) equal height, a period's worth of focus apart (~400-450
Angstrom at the study's physics; LiF and TiN [001] at 33 Angstrom read -419 and -382 with a second peak of
99% of the highest at +32 and +58). Every other peak of at least `ALIAS_PEAK_FRACTION` of the highest is
kept as ``DefocusEstimate.aliases_A``, a reading the data support as well; the model's check
(`models.scan_fit.card_checks`) does not judge a focus one of whose aliases lies inside the training range.

**Thickness** cannot be read from such stacks without the specimen's composition (a thin heavy and a
thick light crystal scatter alike; Bragg scattering inside the detector saturates within ~40
Angstrom). What grows with thickness is compared with a training set's range instead: the
``scattered_fraction`` (intensity outside the bright-field disc, of the pattern's total) and the
``high_angle_loss`` (1 - the mean pattern total: the incident intensity scattered past the
pattern's edge, ~73 mrad at the study's sampling; measurable only while patterns are normalised to
the incident probe, not to their own totals).
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from namsa.errors import UserError

from .microscope.disc import Disc, find_disc

#: bump when an estimate below changes: a card's ranges are compared only with the same version's estimates
STATISTICS_VERSION = 1
#: the stated accuracy of `parallax_defocus` (see the module docstring): Angstrom + fraction of |focus|
DEFOCUS_TOL_A = 50.0
DEFOCUS_TOL_REL = 0.2
#: bright-field pixels within this fraction of the disc radius carry parallax (the soft edge does not)
PARALLAX_DISC_FRACTION = 0.8
#: the search spans trial shifts up to this fraction of the scanned field (beyond it images wrap)
SEARCH_FIELD_FRACTION = 0.45
#: trial focus values in the search, spatial frequencies (the strongest) and bright-field pixels (strided)
#: that enter it: a 256 px detector's thousands of disc pixels say no more than a few hundred
SEARCH_TRIALS = 161
SEARCH_FREQUENCIES = 128
MAX_DISC_PIXELS = 256
#: a focus curve whose peak is below this multiple of its median has no parallax to read (vacuum,
#: an amorphous film at focus, a flat disc)
MIN_PEAK_CONTRAST = 1.5
#: virtual images flatter than this relative RMS carry no specimen contrast at all
MIN_IMAGE_CONTRAST = 1e-4
#: fewer inner bright-field pixels than this cannot show a shift that grows with the beam angle
MIN_DISC_PIXELS = 5
#: a scan direction needs this many of the strongest frequencies for its own reading of the focus
MIN_DIRECTION_FREQUENCIES = 8
#: training stacks `split_ranges` reads for the cheap statistics (scattered fraction, high-angle loss, dose):
#: every one of a split up to this many, strided beyond (5.4-6.2 ms a stack of 1024 x 32 x 32 float16
#: patterns on a busy 2-core EPYC VM: 27-31 s for 5,000; past the limit 1 sample in 10,000 lies beyond each end)
MAX_SPLIT_SAMPLES = 10_000
#: of those, the stacks whose parallax focus `split_ranges` reads, strided: a reading costs ~23 ms a stack
#: (the same VM; ~115 s for 5,000, more than the card's whole budget at the end of a device call), so it
#: stays strided. Its ends matter less: a card with a training config takes the focus range from it
#: (`models.scan_fit.trained_ranges`), and a reading is judged with its own tolerance (`DEFOCUS_TOL_A` +
#: `DEFOCUS_TOL_REL` x |focus|), wider than the strided ends miss by (the flagship's 468 training stacks:
#: every one's focus spans -58..116 A, 64 strided ones' -58..103; the tolerance at 103 A is 71 A)
MAX_DEFOCUS_SAMPLES = 64
#: threads `split_ranges` reads and measures stacks on: the card is written at the end of a device call's
#: training step, inside its 30 s margin, where a node's many cores cut the whole split's pass (the reads
#: and numpy's reductions release the GIL); the figures do not depend on the count
SPLIT_THREADS = min(8, os.cpu_count() or 1)
#: another peak of the focus curve at least this fraction of the highest is as good a reading: a crystal whose
#: lattice shifts by a whole period between neighbouring detector pixels aliases the focus (module docstring)
ALIAS_PEAK_FRACTION = 0.9


@dataclass(frozen=True)
class DefocusEstimate:
    """``value_A``: the probe's focus relative to the specimen's mid-plane (Angstrom, namsa's C1 sign:
    + = overfocus), or None with ``reason``; ``search_A``: the +-range searched; ``peak_contrast``:
    the focus curve's peak over its median (the parallax signal); ``outside``: the focus lies outside
    the +-``search_A`` window (see the module docstring), no value, and ``reason`` says how that shows;
    ``aliases_A``: other readings the curve supports as well (its other peaks of at least
    `ALIAS_PEAK_FRACTION` of the highest, beyond the reading's stated accuracy): a crystal lattice's aliases."""

    value_A: float | None
    search_A: float
    peak_contrast: float
    reason: str = ""
    outside: bool = False
    aliases_A: tuple[float, ...] = ()

    def tolerance_A(self) -> float:
        """The stated accuracy (Angstrom) of this estimate: `DEFOCUS_TOL_A` + `DEFOCUS_TOL_REL` x |value|."""
        return defocus_tolerance_A(self.value_A or 0.0)


def defocus_tolerance_A(value_A: float) -> float:
    """The stated accuracy (Angstrom) of a parallax reading of ``value_A``."""
    return DEFOCUS_TOL_A + DEFOCUS_TOL_REL * abs(value_A)


def bright_field_disc(cbed: np.ndarray) -> Disc | None:
    """The bright-field disc of the stack's mean pattern (`stage.microscope.disc.find_disc`), or None."""
    return find_disc(np.asarray(cbed).mean(axis=0, dtype=np.float64))


def search_range_A(scan_shape: Sequence[int], step_A: Sequence[float], alpha_max_rad: float) -> float:
    """+-Angstrom of focus a parallax search covers: shifts up to `SEARCH_FIELD_FRACTION` of the field."""
    field = min(int(scan_shape[0]) * float(step_A[0]), int(scan_shape[1]) * float(step_A[1]))
    return SEARCH_FIELD_FRACTION * field / alpha_max_rad


def parallax_defocus(cbed: np.ndarray, scan_shape: Sequence[int], step_A: Sequence[float], semiangle_mrad: float,
                     disc: Disc | None = None) -> DefocusEstimate:
    """The focus (Angstrom, relative to the specimen's mid-plane) of a (S, P, P) stack scanned in
    ``scan_shape`` (rows = y) with probe step ``step_A`` (dy, dx) and convergence ``semiangle_mrad``:
    the beam angle per detector pixel is the semi-angle over the measured disc radius, so the
    detector's own calibration is not needed. See the module docstring for method and accuracy."""
    cbed = np.asarray(cbed)
    if cbed.ndim != 3 or int(scan_shape[0]) * int(scan_shape[1]) != len(cbed):
        raise UserError(f"a stack of shape {cbed.shape} is not (S, P, P) with S = scan_shape {tuple(scan_shape)} "
                        f"patterns; pass the scan's patterns in row-major scan order and its scan shape")
    disc = disc or bright_field_disc(cbed)
    if disc is None:
        return DefocusEstimate(None, 0.0, 0.0, "no bright-field disc")
    images, alpha = _bright_field_images(cbed, tuple(int(s) for s in scan_shape), disc, semiangle_mrad)
    if len(alpha) < MIN_DISC_PIXELS:
        return DefocusEstimate(None, 0.0, 0.0, f"the bright-field disc ({disc.radius_px:.1f} px) is too small")
    search = search_range_A(scan_shape, step_A, float(np.hypot(*alpha.T).max()))
    if images is None:
        return DefocusEstimate(None, search, 0.0, "the bright-field images carry no contrast")
    trials = np.linspace(-search, search, SEARCH_TRIALS)
    per_frequency, along_y = _focus_curves(images, alpha, step_A, trials)
    curve = per_frequency.sum(axis=1)
    contrast = float(curve.max() / max(np.median(curve), 1e-300))
    if contrast < MIN_PEAK_CONTRAST:
        return DefocusEstimate(None, search, contrast, "no parallax signal (no specimen contrast, or at focus "
                                                       "through an amorphous film)")
    value = _reading(trials, curve)
    wrapped = _outside_window(trials, value, per_frequency, along_y)
    if wrapped:
        return DefocusEstimate(None, search, contrast, wrapped, outside=True)
    return DefocusEstimate(float(value), search, contrast, aliases_A=_aliases(trials, curve, value))


def _aliases(trials: np.ndarray, curve: np.ndarray, value: float) -> tuple[float, ...]:
    """The focus (Angstrom) at each other interior peak of ``curve`` of at least `ALIAS_PEAK_FRACTION` of its
    highest, farther from ``value`` than the reading's stated accuracy."""
    high = ALIAS_PEAK_FRACTION * curve.max()
    peaks = [j for j in range(1, len(curve) - 1) if curve[j] >= high and curve[j - 1] <= curve[j] > curve[j + 1]]
    readings = (_parabola_peak(trials, curve, j) for j in peaks)
    return tuple(float(r) for r in readings if abs(r - value) > defocus_tolerance_A(value))


def _reading(trials: np.ndarray, curve: np.ndarray) -> float | None:
    """The focus (Angstrom) at the peak of ``curve`` over ``trials``, None when it peaks at either end
    (the focus lies beyond them, or the curve is flat)."""
    best = int(np.argmax(curve))
    return None if best in (0, len(trials) - 1) else _parabola_peak(trials, curve, best)


def _outside_window(trials: np.ndarray, value: float | None, per_frequency: np.ndarray, along_y: np.ndarray) -> str:
    """Why the focus lies outside the searched window ('' when the reading stands): the whole curve
    peaks at the window's edge, or the frequencies along the scan's y and those along its x, each
    with a parallax signal of its own, read the focus differently, and neither's reading is an alias
    of the other's (see the module docstring)."""
    if value is None:
        return "the focus curve peaks at the window's edge"
    curves = []
    for direction in (along_y, ~along_y):
        curve = per_frequency[:, direction].sum(axis=1)
        if direction.sum() < MIN_DIRECTION_FREQUENCIES or curve.max() < MIN_PEAK_CONTRAST * np.median(curve):
            return ""   # one direction alone shows no parallax: nothing to compare
        curves.append(curve)
    along, across = (_reading(trials, curve) for curve in curves)
    if along is None or across is None:
        return f"the frequencies along the scan's {'y' if along is None else 'x'} peak at the window's edge"
    if not _agree(along, across) and not (_peaks_at(trials, curves[0], along, across)
                                          and _peaks_at(trials, curves[1], across, along)):
        return (f"the frequencies along the scan's y read {along:.0f} Angstrom and those along x {across:.0f}, "
                f"as a focus beyond the window wraps differently along each")
    return ""


def _agree(a: float, b: float) -> bool:
    """Whether two readings (Angstrom) agree within the sum of their stated accuracies."""
    return abs(a - b) <= defocus_tolerance_A(a) + defocus_tolerance_A(b)


def _peaks_at(trials: np.ndarray, curve: np.ndarray, reading: float, focus: float) -> bool:
    """Whether ``curve`` (whose highest peak is at ``reading``) peaks (nearly) as high at ``focus``: its
    reading or one of its aliases agrees with ``focus``. When the y and x frequencies read two foci and each
    direction's curve peaks as high at the other's, the two are aliases of one focus, not a wrap (module
    docstring)."""
    return any(_agree(peak, focus) for peak in (reading, *_aliases(trials, curve, reading)))


def _bright_field_images(cbed: np.ndarray, scan_shape: tuple[int, int], disc: Disc,
                         semiangle_mrad: float) -> tuple[np.ndarray | None, np.ndarray]:
    """(n, sy, sx) relative contrast images of the inner bright-field pixels (None when flat) and their
    beam angles (n, 2) [y, x] in rad."""
    p_y, p_x = cbed.shape[1:]
    yy, xx = np.mgrid[:p_y, :p_x]
    dy, dx = yy - disc.centre_px[0], xx - disc.centre_px[1]
    inner = np.flatnonzero(np.hypot(dy, dx).ravel() < PARALLAX_DISC_FRACTION * disc.radius_px)
    inner = inner[::-(-len(inner) // MAX_DISC_PIXELS)] if len(inner) else inner
    alpha = np.stack([dy.ravel()[inner], dx.ravel()[inner]], axis=1) * (semiangle_mrad * 1e-3 / disc.radius_px)
    images = cbed.reshape(len(cbed), -1)[:, inner].T.reshape(-1, *scan_shape).astype(np.float64)
    mean = images.mean(axis=(1, 2), keepdims=True)
    images = images / np.where(mean > 0, mean, 1.0) - 1.0
    return (None if float(np.sqrt(np.mean(images ** 2))) < MIN_IMAGE_CONTRAST else images), alpha


def _focus_curves(images: np.ndarray, alpha: np.ndarray, step_A: Sequence[float],
                  trials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((trials, m) contrast of the tilt-corrected bright-field image at each trial focus (Angstrom) in
    each of the m strongest spatial frequencies, each half of the disc (sign of alpha . q) summed on its
    own; (m,) whether each frequency runs more along the scan's y than its x). Their sum over the
    frequencies is the focus curve."""
    spectra = np.fft.fft2(images).reshape(len(images), -1)           # (n, sy * sx)
    qy = np.fft.fftfreq(images.shape[1], float(step_A[0]))
    qx = np.fft.fftfreq(images.shape[2], float(step_A[1]))
    q = np.stack(np.meshgrid(qy, qx, indexing="ij"), axis=-1).reshape(-1, 2)
    power = (np.abs(spectra) ** 2).sum(axis=0)
    power[0] = 0.0                                                  # q = 0: the mean, no position
    keep = np.argsort(power)[::-1][:SEARCH_FREQUENCIES]
    spectra, dot = spectra[:, keep], alpha @ q[keep].T               # alpha . q: (n, m), cycles per Angstrom
    halves = [dot > 0, dot < 0]
    curves = np.empty((len(trials), len(keep)))
    for i, c1 in enumerate(trials):
        shifted = spectra * np.exp(-2j * np.pi * c1 * dot)
        curves[i] = sum(np.abs(np.where(h, shifted, 0).sum(axis=0)) ** 2 for h in halves)
    return curves, np.abs(q[keep, 0]) >= np.abs(q[keep, 1])


def _parabola_peak(x: np.ndarray, y: np.ndarray, i: int) -> float:
    """The vertex of the parabola through the samples i-1, i, i+1 of a uniformly spaced ``x``."""
    a, b, c = y[i - 1], y[i], y[i + 1]
    denom = a - 2 * b + c
    return float(x[i] + (0.5 * (a - c) / denom if denom else 0.0) * (x[1] - x[0]))


def scattered_fraction(cbed: np.ndarray, disc: Disc) -> float:
    """The fraction of the detected intensity outside the bright-field disc (beyond its radius + 1 px,
    past the aperture's soft edge) in the position-averaged pattern."""
    mean = np.asarray(cbed).mean(axis=0, dtype=np.float64)
    yy, xx = np.mgrid[:mean.shape[0], :mean.shape[1]]
    outside = np.hypot(yy - disc.centre_px[0], xx - disc.centre_px[1]) > disc.radius_px + 1.0
    total = float(mean.sum())
    return float(mean[outside].sum() / total) if total > 0 else 0.0


def high_angle_loss(cbed: np.ndarray) -> float:
    """1 - the mean pattern total: the incident intensity (probe = 1) scattered past the pattern's edge."""
    return 1.0 - float(np.asarray(cbed).sum(axis=(1, 2), dtype=np.float64).mean())


#: above this dose (electrons/Angstrom^2; ~1e7 electrons per pattern at the study's 0.375 A step) shot
#: noise is below a part in 3,000 of a pattern's total: the data count as noise-free
NOISE_FREE_DOSE_E_PER_A2 = 1e8
#: a quantum below float16's smallest normal number (6.1e-5 of the incident probe, i.e. more than 16,384
#: electrons a pattern) is float16 storage's own step, not a count: every float16 value is a multiple of
#: 2^-24, so noise-free float16 stores (the study's) read as 7e7-8e9 e/Angstrom^2 without this rule
MIN_QUANTUM = float(np.finfo(np.float16).smallest_normal)


def dose_from_quanta(cbed: np.ndarray, step_A: float) -> tuple[float, float] | None:
    """(electrons/Angstrom^2, electrons per pattern) of counted patterns, or None when the values are
    not multiples of one quantum (noise-free or not counted), hold too few levels to tell (a flat
    pattern), or the quantum is below `MIN_QUANTUM` or implies at least `NOISE_FREE_DOSE_E_PER_A2`
    (noise-free float data; a dose above the trained range needs no warning anyway). Counted
    patterns divided by their incident count are multiples of 1 / that count; the dose is the count
    over the probe step's area ``step_A`` ** 2."""
    positive = cbed[cbed > 0]
    if positive.size == 0:
        return None
    quantum = float(positive.min())
    if quantum < MIN_QUANTUM:
        return None
    steps = cbed / quantum
    if not np.allclose(steps, np.round(steps), rtol=0.0, atol=1e-2) or np.unique(np.round(steps)).size < 3:
        return None
    electrons = float(cbed.sum(axis=(1, 2), dtype=np.float64).mean()) / quantum
    dose = electrons / step_A ** 2
    return None if dose >= NOISE_FREE_DOSE_E_PER_A2 else (dose, electrons)


def stack_statistics(cbed: np.ndarray, scan_shape: Sequence[int], step_A: Sequence[float],
                     semiangle_mrad: float, defocus: bool = True) -> dict[str, Any]:
    """Every statistic of one (S, P, P) stack (None where it cannot be read): ``defocus_A`` (a
    `DefocusEstimate`; None when ``defocus`` is False, which skips the parallax reading, ~5x the rest's
    cost), ``scattered_fraction``, ``high_angle_loss``, ``dose_e_per_A2``."""
    cbed = np.asarray(cbed)
    disc = bright_field_disc(cbed)
    dose = dose_from_quanta(cbed, min(float(s) for s in step_A))
    focus = parallax_defocus(cbed, scan_shape, step_A, semiangle_mrad, disc) if defocus else None
    return {"defocus_A": focus,
            "scattered_fraction": None if disc is None else scattered_fraction(cbed, disc),
            "high_angle_loss": high_angle_loss(cbed), "dose_e_per_A2": None if dose is None else dose[0]}


#: the unit of each statistic a split's ranges record
UNITS = {"defocus_A": "Angstrom (focus relative to the specimen's mid-plane, + = overfocus)",
         "scattered_fraction": "fraction of the detected intensity outside the bright-field disc",
         "high_angle_loss": "fraction of the incident probe scattered past the pattern's edge",
         "dose_e_per_A2": "electrons/Angstrom^2"}


def split_ranges(paths: str | Path | Sequence[str | Path], split: str = "train", limit: int = MAX_SPLIT_SAMPLES,
                 defocus_limit: int = MAX_DEFOCUS_SAMPLES) -> dict[str, Any] | None:
    """The range (low, high) of each `stack_statistics` value over the ``split`` of the stores at ``paths``:
    the cheap ones over every sample (up to ``limit``, strided beyond), the parallax focus over up to
    ``defocus_limit`` of those (strided; see `MAX_DEFOCUS_SAMPLES`), each stack read with its own meta's scan
    shape, probe step and semi-angle; and those steps' span (Angstrom) and the median semi-angle (mrad): the
    card's ``training_statistics`` section (`models.card.TrainingStatistics`). None when the split is empty."""
    from .storeset import open_stores

    if limit < 1 or defocus_limit < 0:
        raise UserError(f"split_ranges reads limit={limit} >= 1 stacks, defocus_limit={defocus_limit} >= 0 of them")
    values: dict[str, list[float]] = {name: [] for name in UNITS}
    steps: list[float] = []
    semiangles: list[float] = []
    with open_stores(paths) as stores:
        picked = _strided(stores.indices(split), limit)
        focus = set(_strided(picked, defocus_limit))

        def measured(i: int) -> tuple[dict[str, Any], Any]:
            reader, j = stores.locate(i)
            arrays, meta = reader.read_arrays(j, names=("cbed",), dtype=np.float32)
            return stack_statistics(arrays["cbed"], meta.scan_shape, meta.scan_step_A, float(meta.semiangle_mrad),
                                    defocus=i in focus), meta

        with ThreadPoolExecutor(SPLIT_THREADS) as pool:
            for stats, meta in pool.map(measured, picked):   # in order: the same figures at any thread count
                stats["defocus_A"] = None if stats["defocus_A"] is None else stats["defocus_A"].value_A
                for name, value in stats.items():
                    if value is not None and math.isfinite(value):
                        values[name].append(float(value))
                steps += meta.scan_step_A
                semiangles.append(float(meta.semiangle_mrad))
    if not picked:
        return None
    ranges = {name: {"low": min(v), "high": max(v), "samples": len(v), "unit": UNITS[name]}
              for name, v in values.items() if v}
    return {"version": STATISTICS_VERSION, "split": split, "samples": len(picked), "ranges": ranges,
            "step_A": [min(steps), max(steps)], "semiangle_mrad": float(np.median(semiangles))}


def _strided(indices: Sequence[int], limit: int) -> list[int]:
    """Up to ``limit`` of ``indices``, evenly strided from the first to the last (all of them when they are
    at most ``limit``)."""
    if len(indices) <= limit:
        return list(indices)
    return sorted({indices[int(i)] for i in np.linspace(0, len(indices) - 1, limit)}) if limit else []
