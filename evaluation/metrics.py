"""Image-quality metrics for reconstructed projected potentials / densities (numpy only).

Every function takes 2-D maps with axes ``[row = y, col = x]``; ``pred`` is the estimate,
``true`` the reference. This module uses numpy/scipy only (no torch: the functions take any numpy
array, in a notebook, in the evaluation of a model or of the classical iCoM baseline; note that
importing it through the ``evaluation`` package still runs ``evaluation/__init__``, which imports
matplotlib).

Conventions (the metric records of `evaluation.metric_registry` state them for metrics.json and
docs/evaluation.md):

* **data range** (PSNR, SSIM): the peak-to-peak of the *truth*, ``max(true) - min(true)``,
  unless ``data_range`` is passed. For a constant truth (range 0) it falls back to
  ``max(|true|)`` and, for an all-zero truth, to 1.0, so the metrics stay finite.
* **relative L2**: ``||pred - true||_2 / ||true||_2``; 0.0 when both are zero, ``inf`` when only
  the truth is zero.
* **PSNR**: ``10 log10(R^2 / MSE)`` (dB), ``inf`` for identical maps.
* **SSIM**: Wang, Bovik, Sheikh & Simoncelli, IEEE TIP 13, 600 (2004): Gaussian window
  (sigma = 1.5 px, truncated at 3.5 sigma: 11 taps), K1 = 0.01, K2 = 0.03, population
  covariances. ``mode="wrap"`` (default) treats the map as periodic, which it is here (the scan
  covers a periodic field of view), and averages over every pixel; ``mode="reflect"`` reproduces
  ``skimage.metrics.structural_similarity(..., gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False)``, which reflects at the border and crops 5 px before averaging.
* **Pearson r**: 0.0 when either map is constant (no linear relation can be measured).
* **column position error**: atomic columns are local maxima of the truth; the distance (Angstrom)
  between each true column and its matched predicted maximum (Hungarian matching with periodic
  minimum-image distances).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import ndimage, optimize, stats

#: Wang et al. (2004) constants.
SSIM_K1 = 0.01
SSIM_K2 = 0.03
SSIM_SIGMA_PX = 1.5
SSIM_TRUNCATE = 3.5


def _pair(pred: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape:
        raise ValueError(f"pred {pred.shape} and true {true.shape} must have the same shape")
    return pred, true


def data_range_of(true: np.ndarray, data_range: float | None = None) -> float:
    """The data range R used by PSNR and SSIM: ptp of the truth (see module docstring)."""
    if data_range is not None:
        return float(data_range)
    true = np.asarray(true, dtype=np.float64)
    span = float(np.ptp(true))
    if span > 0:
        return span
    peak = float(np.max(np.abs(true))) if true.size else 0.0
    return peak if peak > 0 else 1.0


def relative_l2(pred: np.ndarray, true: np.ndarray) -> float:
    """``||pred - true||_2 / ||true||_2`` (dimensionless)."""
    pred, true = _pair(pred, true)
    err = float(np.linalg.norm(pred - true))
    ref = float(np.linalg.norm(true))
    if ref == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / ref


def level_and_contrast(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """The relative L2 error split into its two orthogonal parts, ``rel_l2**2 = level**2 + contrast**2``.

    ``rel_l2_level``: the error of the map's mean, ``|mean(pred) - mean(true)| sqrt(N) / ||true||``;
    ``rel_l2_contrast``: the error of what is left, ``||(pred - mean) - (true - mean)|| / ||true||``.
    A uniform phase leaves every diffraction intensity unchanged, so a map's mean (thickness times
    the mean inner potential) is what intensities determine least: the legacy rule's fitted baselines
    took it from the truth (their level part is ~0 by construction), the network must infer it
    (`evaluation.views`). Both parts are dimensionless fractions of the truth's norm.
    """
    pred, true = _pair(pred, true)
    ref = float(np.linalg.norm(true))
    if ref == 0.0:
        return {"rel_l2_level": math.inf, "rel_l2_contrast": math.inf}
    level = abs(float(pred.mean() - true.mean())) * math.sqrt(true.size) / ref
    contrast = float(np.linalg.norm((pred - pred.mean()) - (true - true.mean()))) / ref
    return {"rel_l2_level": level, "rel_l2_contrast": contrast}


def mse(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean squared error (units of the maps squared)."""
    pred, true = _pair(pred, true)
    return float(np.mean((pred - true) ** 2))


def psnr(pred: np.ndarray, true: np.ndarray, data_range: float | None = None) -> float:
    """Peak signal-to-noise ratio in dB, ``10 log10(R^2 / MSE)``; R = ptp(true) by default."""
    err = mse(pred, true)
    if err == 0.0:
        return math.inf
    r = data_range_of(true, data_range)
    return float(10.0 * np.log10(r * r / err))


def ssim(pred: np.ndarray, true: np.ndarray, data_range: float | None = None,
         mode: str = "wrap", full: bool = False) -> float | tuple[float, np.ndarray]:
    """Mean structural similarity (Wang et al. 2004, Gaussian window); see module docstring.

    ``full=True`` also returns the SSIM map (same shape as the inputs).
    """
    pred, true = _pair(pred, true)
    if mode not in ("wrap", "reflect"):
        raise ValueError(f"ssim mode must be 'wrap' or 'reflect', got {mode!r}")
    r = data_range_of(true, data_range)
    c1 = (SSIM_K1 * r) ** 2
    c2 = (SSIM_K2 * r) ** 2

    def blur(img: np.ndarray) -> np.ndarray:
        return ndimage.gaussian_filter(img, sigma=SSIM_SIGMA_PX, truncate=SSIM_TRUNCATE, mode=mode)

    mx, my = blur(pred), blur(true)
    vx = blur(pred * pred) - mx * mx
    vy = blur(true * true) - my * my
    cxy = blur(pred * true) - mx * my
    num = (2 * mx * my + c1) * (2 * cxy + c2)
    den = (mx * mx + my * my + c1) * (vx + vy + c2)
    smap = num / den
    if mode == "reflect":
        # skimage averages only where the window does not touch the reflected border.
        pad = int(SSIM_TRUNCATE * SSIM_SIGMA_PX + 0.5)
        inner = smap[pad:-pad, pad:-pad] if min(smap.shape) > 2 * pad else smap
        value = float(inner.mean())
    else:
        value = float(smap.mean())
    return (value, smap) if full else value


def pearson_r(pred: np.ndarray, true: np.ndarray) -> float:
    """Pearson correlation coefficient of the two maps' pixels; 0.0 if either is constant."""
    pred, true = _pair(pred, true)
    a = pred.ravel() - pred.mean()
    b = true.ravel() - true.mean()
    den = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    if den == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / den, -1.0, 1.0))


def fit_affine(estimate: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """Least-squares ``(scale, offset)`` minimising ``||scale * estimate + offset - true||_2``.

    The structure view's fit (`evaluation.views`): it uses the truth, for these two scalars.
    """
    est, true = _pair(estimate, true)
    design = np.stack([est.ravel(), np.ones(est.size)], axis=1)
    (scale, offset), *_ = np.linalg.lstsq(design, true.ravel(), rcond=None)
    return float(scale), float(offset)


def fit_affine_nonnegative(estimate: np.ndarray, true: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``(scale, offset)`` with ``scale >= 0``, and the unconstrained (signed) scale.

    A negative scale would turn a map upside down to match the truth: more than the two scalars the
    fit is meant to be. With one scalar constrained the
    optimum is either the unconstrained fit (its scale is already >= 0) or the boundary scale = 0,
    where the best offset is the truth's mean (the best constant map). Returns
    ``(scale, offset, signed_scale)``; ``signed_scale`` is what `fit_affine` would have used.
    """
    signed_scale, offset = fit_affine(estimate, true)
    if signed_scale >= 0.0:
        return signed_scale, offset, signed_scale
    return 0.0, float(np.mean(np.asarray(true, dtype=np.float64))), signed_scale


# --------------------------------------------------------------------------- atomic columns

def find_columns(img: np.ndarray, min_distance_px: int = 1, threshold_rel: float = 0.3,
                 periodic: bool = True) -> np.ndarray:
    """Sub-pixel positions (row, col), in pixels, of local maxima ("atomic columns") of ``img``.

    A maximum counts when it is the largest value within ``min_distance_px`` (a
    ``(2 d + 1)^2`` window, periodic if ``periodic``) and rises above
    ``min + threshold_rel * ptp``. Positions are refined with a 3-point parabola per axis.
    Returns an (N, 2) float array, [row = y, col = x].
    """
    img = np.asarray(img, dtype=np.float64)
    span = float(np.ptp(img))
    if span == 0.0:
        return np.zeros((0, 2))
    mode = "wrap" if periodic else "nearest"
    local_max = ndimage.maximum_filter(img, size=2 * min_distance_px + 1, mode=mode)
    # Plateaus would give several equal maxima; keep one per plateau (the first labelled pixel).
    is_peak = (img == local_max) & (img >= img.min() + threshold_rel * span)
    labels, n = ndimage.label(is_peak)
    if n == 0:
        return np.zeros((0, 2))
    first = ndimage.minimum_position(np.arange(img.size).reshape(img.shape), labels, range(1, n + 1))
    peaks = np.asarray(first, dtype=np.int64).reshape(-1, 2)
    return _refine_parabola(img, peaks, periodic)


def _refine_parabola(img: np.ndarray, peaks: np.ndarray, periodic: bool) -> np.ndarray:
    """Move each integer peak by the vertex of a parabola through its 3 neighbours per axis."""
    ny, nx = img.shape
    out = peaks.astype(np.float64)
    for axis, n in ((0, ny), (1, nx)):
        for i, (r, c) in enumerate(peaks):
            idx = [r, c]
            lo, hi = list(idx), list(idx)
            lo[axis] -= 1
            hi[axis] += 1
            if not periodic and (lo[axis] < 0 or hi[axis] >= n):
                continue
            lo[axis] %= n
            hi[axis] %= n
            fm, f0, fp = img[tuple(lo)], img[r, c], img[tuple(hi)]
            den = fm - 2 * f0 + fp
            if den < 0:
                out[i, axis] += float(np.clip(0.5 * (fm - fp) / den, -0.5, 0.5))
    if periodic:
        out[:, 0] %= ny
        out[:, 1] %= nx
    return out


@dataclass
class ColumnError:
    """Result of :func:`column_position_error`; distances in Angstrom."""

    n_true: int
    n_pred: int
    n_matched: int
    mean_error_A: float | None      # None when no true column was matched (not resolved)
    rms_error_A: float | None
    recall: float | None            # matched / true columns
    precision: float | None         # matched / predicted maxima

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def column_position_error(pred: np.ndarray, true: np.ndarray, pixel_size_A: Sequence[float] | float,
                          max_distance_A: float | None = None, min_distance_px: int = 1,
                          threshold_rel: float = 0.3, periodic: bool = True) -> ColumnError:
    """Atomic-column position error between the maxima of ``pred`` and of ``true``.

    pixel_size_A: (dy, dx) or one value, Angstrom per pixel of the maps.
    max_distance_A: a predicted maximum farther than this from a true column is no match;
    default: half the median nearest-neighbour distance between true columns (at least one
    pixel). Distances use the minimum-image convention when ``periodic``.
    """
    pred, true = _pair(pred, true)
    dy, dx = (float(pixel_size_A),) * 2 if np.isscalar(pixel_size_A) else map(float, pixel_size_A)
    scale = np.array([dy, dx])
    period = np.array(true.shape, dtype=np.float64) * scale
    t = find_columns(true, min_distance_px, threshold_rel, periodic) * scale
    p = find_columns(pred, min_distance_px, threshold_rel, periodic) * scale
    if len(t) == 0 or len(p) == 0:
        return ColumnError(len(t), len(p), 0, None, None, 0.0 if len(t) else None,
                           0.0 if len(p) else None)
    if max_distance_A is None:
        max_distance_A = _default_match_radius(t, period if periodic else None, min(dy, dx))
    dist = _pairwise_distance(t, p, period if periodic else None)
    rows, cols = optimize.linear_sum_assignment(dist)
    good = dist[rows, cols] <= max_distance_A
    matched = dist[rows, cols][good]
    if matched.size == 0:
        return ColumnError(len(t), len(p), 0, None, None, 0.0, 0.0)
    return ColumnError(len(t), len(p), int(matched.size), float(matched.mean()),
                       float(np.sqrt(np.mean(matched ** 2))), matched.size / len(t), matched.size / len(p))


def _pairwise_distance(a: np.ndarray, b: np.ndarray, period: np.ndarray | None) -> np.ndarray:
    delta = a[:, None, :] - b[None, :, :]
    if period is not None:
        delta -= period * np.round(delta / period)
    return np.sqrt((delta ** 2).sum(-1))


def _default_match_radius(columns: np.ndarray, period: np.ndarray | None, min_px_A: float) -> float:
    if len(columns) < 2:
        return max(min_px_A, float(np.min(period)) / 4 if period is not None else min_px_A)
    dist = _pairwise_distance(columns, columns, period)
    np.fill_diagonal(dist, np.inf)
    return max(min_px_A, 0.5 * float(np.median(dist.min(axis=1))))


# --------------------------------------------------------------------------- aggregation

@dataclass
class Interval:
    """A statistic with its bootstrap confidence interval (over samples, or over groups of samples)."""

    value: float | None
    low: float | None
    high: float | None
    n: int                # finite values used
    n_nonfinite: int      # values left out (inf/nan/None), e.g. PSNR of a perfect prediction
    n_groups: int | None = None   # groups (materials) with a finite value; None: resampled by sample

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_STATISTICS: dict[str, Callable[..., np.ndarray]] = {"mean": np.mean, "median": np.median}


def bootstrap_ci(values: Sequence[float | None], n_resamples: int = 1000, level: float = 0.95,
                 statistic: str = "mean", seed: int = 0, groups: Sequence[object] | None = None) -> Interval:
    """Percentile bootstrap CI of the mean (or median) over the finite entries of ``values``.

    Non-finite entries (None, NaN, +-inf) are counted, not used. With one finite value (or all
    values equal) the interval collapses onto the point estimate; with none every field is None.

    groups: one label per value (e.g. the material of each sample). Then whole groups are
    resampled with replacement, each drawn group bringing all of its samples, and the interval is
    the percentile interval of the pooled mean: samples of one material are not independent, so
    resampling them one by one would understate the uncertainty. Mean only. With fewer than two
    groups the interval collapses onto the point estimate (`Interval.n_groups` says so).
    """
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(_STATISTICS)}, got {statistic!r}")
    if groups is not None and (statistic != "mean" or len(groups) != len(values)):
        raise ValueError(f"a grouped bootstrap takes one group label per value ({len(groups)} labels for "
                         f"{len(values)} values) and the mean only (got {statistic!r})")
    func = _STATISTICS[statistic]
    raw = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    ok = np.isfinite(raw)
    finite = raw[ok]
    n_bad = int(raw.size - finite.size)
    labels = None if groups is None else np.unique([str(g) for g, keep in zip(groups, ok) if keep],
                                                   return_inverse=True)[1]
    n_groups = None if labels is None else int(labels.max(initial=-1) + 1)
    if finite.size == 0:
        return Interval(None, None, None, 0, n_bad, n_groups)
    point = float(func(finite))
    if finite.size == 1 or np.ptp(finite) == 0 or n_resamples < 1 or (n_groups is not None and n_groups < 2):
        return Interval(point, point, point, int(finite.size), n_bad, n_groups)
    if labels is not None:
        low, high = _grouped_mean_interval(finite, labels, n_resamples, level, seed)
        return Interval(point, low, high, int(finite.size), n_bad, n_groups)
    res = stats.bootstrap((finite,), func, n_resamples=n_resamples, confidence_level=level,
                          method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return Interval(point, float(res.confidence_interval.low), float(res.confidence_interval.high),
                    int(finite.size), n_bad)


def _grouped_mean_interval(values: np.ndarray, labels: np.ndarray, n_resamples: int, level: float,
                           seed: int) -> tuple[float, float]:
    """Percentile interval of the pooled mean when whole groups (``labels`` 0..G-1) are resampled."""
    sums = np.bincount(labels, weights=values)
    counts = np.bincount(labels).astype(np.float64)
    draws = np.random.default_rng(seed).integers(0, sums.size, size=(n_resamples, sums.size))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


def image_metrics(pred: np.ndarray, true: np.ndarray, data_range: float | None = None) -> dict[str, float]:
    """The four whole-map metrics at once: rel_l2, psnr_db, ssim, pearson_r (each a whole-map record of
    `evaluation.metric_registry`, which says how they are aggregated, named and judged)."""
    return {
        "rel_l2": relative_l2(pred, true),
        "psnr_db": psnr(pred, true, data_range),
        "ssim": ssim(pred, true, data_range),
        "pearson_r": pearson_r(pred, true),
    }
