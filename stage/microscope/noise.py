"""What a file's noise is: a photon-transfer measurement over the scan (gain, dark level, read noise).

A detector's pixel value x (counts) is ``dark + gain * electrons + read noise``: a counting detector
has gain 1 count per electron, dark 0 and no read noise (variance = mean, Poisson); an integrating
(scintillator, CCD/CMOS) camera has a gain g (counts per electron), a dark offset (counts) and
Gaussian read noise sigma_r (counts rms), so that var(x) = sigma_r^2 + g (mean(x) - dark). Measuring
that variance-to-mean relation over many signal levels is the photon-transfer method (J. R. Janesick,
"Photon Transfer: DN -> lambda", SPIE Press 2007, ch. 2-5; the same relation as the EMVA 1288
standard's). Its total-noise model, var = read^2 + g m + (P_N m)^2, has a third term for noise
proportional to the signal (Janesick's fixed-pattern noise, quality factor P_N): here it takes up
what is left of the specimen's own signal variation (below), so the shot-noise slope g is fitted
beside it, not polluted by it.

A 4D-STEM file has one frame per probe position, so the variance cannot be taken over repeated
frames of one signal. Two things stand in the way, and how each is met:

- **The signal changes with the probe position** (the specimen). The noise is taken from the
  differences of horizontally adjacent patterns, d = x(y, x+1) - x(y, x): a descan drift and the
  slow changes of the patterns cancel, the noise (independent between positions) doubles, so
  var = E[d^2] / 2. What changes between neighbours (an atomic column passing under the probe) is
  left, and it grows as the signal squared while shot noise grows as the signal: the P_N m^2 term.
- **A scintillator's point spread correlates neighbouring pixels' noise**, so one pixel's variance
  holds only sum(PSF^2) of an electron's (0.08 for a Gaussian of sigma 1 px): its gain would read
  12x too low. The detector is binned by b x b pixels, and the variance of a bin is taken as its
  covariance with the sum of its 3 x 3 neighbourhood of bins (the noise power at zero frequency,
  NPS(0), as detective-quantum-efficiency measurements bin for it: G. McMullan et al.,
  Ultramicroscopy 109 (2009) 1126). With b at least three times the point spread's sigma (measured from the
  noise correlation of adjacent pixels at lag 1 and 2, whose ratio does not depend on the white read
  noise) the neighbourhood holds more than 97% of an electron's light; a counting detector's white
  noise gets b = 1.

The dark level and read noise come from the darkest pixels of the mean pattern (the outer dark
field): the lower tail of their values is the read noise's Gaussian, shifted by the dark level
(dark = q(15.9%) + sigma, sigma = q(15.9%) - q(2.3%)); the few electrons that fall there only
lift the upper tail. The scan is read by slicing only, at most `MAX_POSITIONS` patterns (whole rows
on a stride, in column blocks of bounded bytes), so memory does not grow with the file. Axis order:
(scan_y, scan_x, ky, kx).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import autocal

#: patterns read for the measurement (whole scan rows on a stride): 4,096 adjacent pairs give each
#: bin's variance to ~2%
MAX_POSITIONS = 4096
#: the darkest pixels' values kept for the dark level and read noise (float32; thinned by halves beyond
#: it): a 4096-pattern read of 256 x 256 px patterns would otherwise hold ~27 MB of them
MAX_DARK_VALUES = 2**18
#: bytes of float64 patterns the measurement reads in all (a large detector: fewer positions)
MAX_READ_BYTES = 512 * 2**20
#: fewest adjacent pairs a variance is taken from
MIN_PAIRS = 32
#: the gain's relative standard error above which it is not trusted
GAIN_RTOL = 0.2
#: shot noise must explain at least this much of the measured variance (median over bins with signal),
#: else the variance is the specimen's (or the data are noise-free) and no gain is measured
MIN_SHOT_FRACTION = 0.3
#: fraction of the detector's pixels (darkest of the mean pattern) whose values give dark and read noise
DARK_FRACTION = 0.1
#: fraction of the pixels (dimmest of the mean pattern) whose noise correlation gives the point spread
PSF_FRACTION = 0.9
#: the quadratic (specimen) term may reach at most this fraction of the shot term at the highest
#: signal level fitted: the fit takes the dimmest bins up to the highest level where that holds
MAX_SIGNAL_SHARE = 0.3
#: signal levels tried as the top of the fit (quantiles of the bins' mean signal)
FIT_QUANTILES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class NoiseMeasurement:
    """The photon-transfer measurement of a scan (see the module docstring).

    gain: counts per electron (nan when not measured), gain_err its standard error; dark: counts
    (the level of a pixel without electrons); read_noise: counts rms per pixel and frame;
    read_noise_fit: the same from the fit's intercept (counts rms; nan when negative);
    negative_fraction: fraction of the pixels read below 0; shot_fraction: median over bins with
    signal of the share of their variance that shot noise explains; psf_sigma_px: the point spread
    the noise correlation shows (0: white noise); bin_px: the binning used; pairs: adjacent pattern
    pairs read; whole_numbers: whether every value read is a whole number; mean_total: counts per
    pattern; value_gcd: the greatest common divisor of whole-number values (1 otherwise: a camera that
    writes gain x electrons in whole numbers shows its gain here); why: "" when the gain is
    trusted, else the reason in words."""

    gain: float
    gain_err: float
    dark: float
    read_noise: float
    read_noise_fit: float
    negative_fraction: float
    shot_fraction: float
    psf_sigma_px: float
    bin_px: int
    pairs: int
    whole_numbers: bool
    mean_total: float
    value_gcd: int
    why: str

    @property
    def trusted(self) -> bool:
        """Whether the photon-transfer gain passed its checks (a slope measured to GAIN_RTOL, shot noise
        at least MIN_SHOT_FRACTION of the variance at the top of the fit)."""
        return not self.why

    def record(self) -> dict[str, Any]:
        """The JSON record (nan as None)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass
class _Sums:
    """Accumulators over the pairs read: per bin, the sum of values and of d * (3 x 3 sum of d);
    per pixel lag, the sums of d products; the darkest pixels' values; counts."""

    values: np.ndarray
    cross: np.ndarray
    lags: np.ndarray
    dark_values: list[np.ndarray]
    patterns: int = 0
    pairs: int = 0
    negative: int = 0
    pixels: int = 0
    whole: bool = True
    gcd: int = 0
    total: float = 0.0


def measure_noise(data: Any, block_bytes: int = autocal.BLOCK_BYTES) -> NoiseMeasurement:
    """The photon-transfer measurement of ``data`` (scan_y, scan_x, ky, kx) in counts, read by slicing
    in blocks of at most ``block_bytes`` (float64) and at most `MAX_POSITIONS` patterns."""
    sy, sx, ky, kx = data.shape
    mean = autocal.subsample(data).mean(axis=0)
    dark_mask = mean <= np.quantile(mean, DARK_FRACTION)
    rows = _rows(data.shape)
    sigma = _psf_sigma(data, rows[: max(1, len(rows) // 4)], block_bytes, mean <= np.quantile(mean, PSF_FRACTION))
    b = max(1, math.ceil(3.0 * sigma)) if sigma > 0 else 1
    sums = _Sums(values=np.zeros((ky // b, kx // b)), cross=np.zeros((ky // b, kx // b)), lags=np.zeros(3),
                 dark_values=[])
    for y in rows:
        for x0, x1 in _column_chunks(sx, ky * kx * 8, block_bytes):
            _accumulate(sums, np.asarray(data[y, x0:x1], dtype=np.float64), b, dark_mask)
    return _fit(sums, b, sigma)


def _rows(shape: tuple[int, ...]) -> list[int]:
    """Scan rows on a stride: whole rows, at most MAX_POSITIONS patterns and MAX_READ_BYTES."""
    sy, sx, ky, kx = shape
    n = max(2 * sx, min(MAX_POSITIONS, MAX_READ_BYTES // (ky * kx * 8)))
    count = max(1, min(sy, n // sx))
    return sorted({int(round(r)) for r in np.linspace(0, sy - 1, count)})


def _column_chunks(sx: int, per_pattern: int, block_bytes: int) -> list[tuple[int, int]]:
    """Column ranges of one row, each within ``block_bytes``, overlapping by one column so that
    every adjacent pair is inside one chunk."""
    width = max(2, block_bytes // per_pattern)
    return [(x0, min(sx, x0 + width)) for x0 in range(0, max(1, sx - 1), width - 1)]


def _psf_sigma(data: Any, rows: list[int], block_bytes: int, mask: np.ndarray) -> float:
    """The point spread's sigma (px) from the correlation of adjacent pixels' noise (pattern
    differences) at lag 1 and 2: for a Gaussian PSF the noise correlation is exp(-lag^2 / (4 sigma^2)),
    so rho2 / rho1 = exp(-3 / (4 sigma^2)), which white read noise does not change; 0 for white noise.
    Only the pixels of ``mask`` (the dimmer part of the mean pattern) count: the bright-field disc's
    differences are the specimen's, smooth across pixels, and would read as a point spread."""
    products = np.zeros(3)
    for y in rows:
        for x0, x1 in _column_chunks(data.shape[1], data.shape[2] * data.shape[3] * 8, block_bytes):
            d = np.diff(np.asarray(data[y, x0:x1], dtype=np.float64), axis=0) * mask
            products += _lag_products(d)
    if products[0] <= 0:
        return 0.0
    rho1, rho2 = products[1] / products[0], products[2] / products[0]
    if rho1 < 0.02 or rho2 <= 0 or rho2 >= rho1:
        return 0.0  # white noise (a counting detector): the neighbours' noise is independent
    return float(math.sqrt(-3.0 / (4.0 * math.log(rho2 / rho1))))


def _lag_products(d: np.ndarray) -> np.ndarray:
    """[sum d^2, mean-normalised sum of d * d shifted by 1 px, by 2 px] over both detector axes."""
    zero = float((d * d).sum())
    one = float((d[..., 1:, :] * d[..., :-1, :]).sum() + (d[..., :, 1:] * d[..., :, :-1]).sum()) / 2
    two = float((d[..., 2:, :] * d[..., :-2, :]).sum() + (d[..., :, 2:] * d[..., :, :-2]).sum()) / 2
    return np.array([zero, one, two])


def _binned(block: np.ndarray, b: int) -> np.ndarray:
    """(w, ky, kx) patterns summed over b x b pixels (a remainder at the edges left out)."""
    w, ky, kx = block.shape
    ny, nx = ky // b, kx // b
    return block[:, : ny * b, : nx * b].reshape(w, ny, b, nx, b).sum(axis=(2, 4))


def _neighbourhood(d: np.ndarray) -> np.ndarray:
    """The sum over each bin's 3 x 3 neighbourhood of bins (zero beyond the detector)."""
    padded = np.pad(d, ((0, 0), (1, 1), (1, 1)))
    ny, nx = d.shape[1:]
    return sum(padded[:, i: i + ny, j: j + nx] for i in range(3) for j in range(3))


def _accumulate(sums: _Sums, block: np.ndarray, b: int, dark_mask: np.ndarray) -> None:
    """Add one row chunk (w, ky, kx) of counts to ``sums``."""
    binned = _binned(block, b)
    sums.values += binned[1:].sum(axis=0)   # the first column of a chunk is the last of the previous one
    d = np.diff(binned, axis=0)
    sums.cross += (d * _neighbourhood(d)).sum(axis=0)
    sums.pairs += d.shape[0]
    sums.patterns += d.shape[0]
    sums.total += float(block[1:].sum())
    sums.negative += int(np.count_nonzero(block[1:] < 0))
    sums.pixels += block[1:].size
    sums.whole = sums.whole and bool(np.all(block == np.round(block)))
    if sums.whole and np.abs(block).max() < 2**53:
        sums.gcd = int(np.gcd.reduce(np.append(block.astype(np.int64).ravel(), sums.gcd)))
    sums.dark_values.append(block[1:, dark_mask].ravel().astype(np.float32))
    if sum(len(v) for v in sums.dark_values) > MAX_DARK_VALUES:   # thinned evenly: quantiles keep, memory stays flat
        sums.dark_values = [np.concatenate(sums.dark_values)[::2]]


def _dark_and_read(values: np.ndarray) -> tuple[float, float]:
    """(dark level, read noise) in counts from the lower tail of the darkest pixels' values."""
    q02, q16 = np.quantile(values, [0.0228, 0.1587])
    sigma = float(q16 - q02)
    return float(q16 + sigma), sigma


def _fit(sums: _Sums, b: int, sigma_psf: float) -> NoiseMeasurement:
    """The gain from var = a + g m' + p m'^2 over the bins (m' = mean - b^2 dark), weighted by the
    inverse square of the fitted variance (each variance is known to a fixed fraction), inner bins only."""
    values = np.concatenate(sums.dark_values) if sums.dark_values else np.zeros(0)
    dark, read = _dark_and_read(values) if values.size else (0.0, 0.0)   # a 1-wide scan has no pairs
    facts = dict(dark=dark, read_noise=read, negative_fraction=sums.negative / max(sums.pixels, 1),
                 psf_sigma_px=sigma_psf, bin_px=b, pairs=sums.pairs, whole_numbers=sums.whole,
                 mean_total=sums.total / max(sums.patterns, 1), value_gcd=sums.gcd if sums.whole and sums.gcd else 1)
    if sums.pairs < MIN_PAIRS or min(sums.values.shape) < 3:
        return _unmeasured(facts, f"only {sums.pairs} adjacent pattern pairs and {sums.values.size} detector bins: "
                                  "too few to measure the noise")
    inner = (slice(1, -1), slice(1, -1))  # the outer bins' neighbourhoods are cut by the detector's edge
    m = sums.values[inner].ravel() / sums.patterns - b * b * dark
    var = sums.cross[inner].ravel() / (2.0 * sums.pairs)
    if not np.any(var > 0):
        return _unmeasured(facts, "the patterns do not change between neighbouring probe positions: no noise")
    coef, err, top = _shot_regime_fit(m, var)
    a, g, p = coef
    model = a + g * m + p * m * m
    fitted = (m >= np.quantile(m[m <= top], 0.9)) & (m <= top)  # the top of the fitted range
    shot = float(np.median(g * m[fitted] / np.maximum(model[fitted], 1e-300))) if fitted.any() else 0.0
    facts.update(read_noise_fit=math.sqrt(a / (b * b)) if a > 0 else math.nan, shot_fraction=shot)
    why = ""
    if not (g > 0 and err[1] <= GAIN_RTOL * g):
        why = (f"the variance-to-mean slope {g:.3g} +- {err[1]:.2g} counts per electron is not a measured gain"
               if math.isfinite(g) else "the variance-to-mean relation could not be fitted")
    elif shot < MIN_SHOT_FRACTION:
        why = (f"shot noise explains only {100 * shot:.0f}% of the patterns' variance (the rest is the specimen's "
               "signal, or the data are noise-free)")
    return NoiseMeasurement(gain=float(g), gain_err=float(err[1]), why=why, **facts)


def _shot_regime_fit(m: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(a, g, p), their errors and the highest signal fitted: `_weighted_fit` over the dimmest bins up
    to the highest of `FIT_QUANTILES` whose quadratic term stays below MAX_SIGNAL_SHARE of the shot term
    there (the specimen's variation grows faster than the signal, so the bright-field disc's bins are
    the specimen's, the dim ones the camera's); the lowest cut when none does (the fit is then judged)."""
    best = None
    for q in FIT_QUANTILES:
        top = float(np.quantile(m, q))
        used = m <= top
        if used.sum() < 6:
            continue
        try:
            coef, err = _weighted_fit(m[used], var[used])
        except np.linalg.LinAlgError:  # a degenerate set of levels: try the next cut
            continue
        if best is None or (coef[1] > 0 and coef[2] * top <= MAX_SIGNAL_SHARE * coef[1]):
            best = (coef, err, top)
    if best is None:
        return np.full(3, math.nan), np.full(3, math.nan), math.inf
    return best


def _unmeasured(facts: dict[str, Any], why: str) -> NoiseMeasurement:
    return NoiseMeasurement(gain=math.nan, gain_err=math.nan, read_noise_fit=math.nan, shot_fraction=0.0, why=why,
                            **facts)


def _weighted_fit(m: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a, g, p) of var = a + g m + p m^2 and their standard errors: least squares weighted by
    1 / model^2, iterated from an unweighted start (a variance is known to a fixed fraction of itself).
    Degenerate input (all-zero or denormal bins) gives non-finite figures, which `_fit` reads as untrusted."""
    with np.errstate(all="ignore"):
        return _weighted_fit_unguarded(m, var)


def _weighted_fit_unguarded(m: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    design = np.stack([np.ones_like(m), m, m * m], axis=1)
    scale = np.array([1.0, 1.0 / max(float(np.abs(m).max()), 1e-300), 1.0 / max(float(m.max()) ** 2, 1e-300)])
    x = design * scale  # columns of comparable size: a well-conditioned solve
    floor = max(float(np.median(np.abs(var))), 1e-300) * 1e-3
    weights = np.ones_like(m)
    coef = np.zeros(3)
    for _ in range(3):
        root = np.sqrt(weights)[:, None]
        coef, *_ = np.linalg.lstsq(x * root, var * root[:, 0], rcond=None)
        weights = 1.0 / np.maximum(np.abs(x @ coef), floor) ** 2
    resid = (var - x @ coef) * np.sqrt(weights)
    dof = max(len(m) - 3, 1)
    cov = np.linalg.pinv((x * np.sqrt(weights)[:, None]).T @ (x * np.sqrt(weights)[:, None])) * float(resid @ resid) / dof
    return coef * scale, np.sqrt(np.clip(np.diag(cov), 0.0, None)) * scale
