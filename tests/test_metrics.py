"""evaluation.metrics against hand-computed values and scikit-image's SSIM."""
from __future__ import annotations

import math

import numpy as np
import pytest
from skimage.metrics import structural_similarity as skimage_ssim

from evaluation import metrics as M


def _lattice(shape=(64, 64), pixel_A=0.25, spacing_A=4.0, sigma_A=0.35, shifts_A=None):
    """Periodic lattice of Gaussian 'columns'; shifts_A: (n_columns, 2) displacements."""
    ny, nx = shape
    y, x = np.mgrid[0:ny, 0:nx] * pixel_A
    period = np.array([ny, nx]) * pixel_A
    centres = np.array([[cy, cx] for cy in np.arange(1.0, period[0], spacing_A)
                        for cx in np.arange(1.3, period[1], spacing_A)])
    if shifts_A is not None:
        centres = centres + shifts_A
    img = np.zeros(shape)
    for cy, cx in centres:
        dy = (y - cy + period[0] / 2) % period[0] - period[0] / 2
        dx = (x - cx + period[1] / 2) % period[1] - period[1] / 2
        img += np.exp(-(dy ** 2 + dx ** 2) / (2 * sigma_A ** 2))
    return img, centres


def test_relative_l2_hand_values():
    true = np.array([[3.0, 4.0]])
    assert M.relative_l2(np.zeros_like(true), true) == pytest.approx(1.0)
    assert M.relative_l2(np.array([[3.0, 0.0]]), true) == pytest.approx(0.8)
    assert M.relative_l2(true, true) == 0.0


def test_relative_l2_zero_truth_is_defined():
    zero = np.zeros((4, 4))
    assert M.relative_l2(zero, zero) == 0.0
    assert M.relative_l2(zero + 1, zero) == math.inf


def test_psnr_hand_value_and_convention():
    true = np.array([[0.0, 1.0], [2.0, 3.0]])          # data range 3
    pred = true + np.array([[1.0, 0.0], [0.0, 0.0]])   # MSE 0.25
    assert M.psnr(pred, true) == pytest.approx(10 * math.log10(9 / 0.25))
    # An explicit data range overrides the truth's peak-to-peak.
    assert M.psnr(pred, true, data_range=1.0) == pytest.approx(10 * math.log10(1 / 0.25))
    assert M.psnr(true, true) == math.inf


def test_psnr_constant_truth_is_finite():
    true = np.full((4, 4), 2.0)     # range 0 -> falls back to |2|
    pred = np.full((4, 4), 1.0)     # MSE 1
    assert M.psnr(pred, true) == pytest.approx(10 * math.log10(4.0))
    zero = np.zeros((4, 4))         # all-zero truth -> range 1
    assert M.psnr(zero + 0.5, zero) == pytest.approx(10 * math.log10(1 / 0.25))
    assert not math.isnan(M.psnr(zero, zero))


def test_pearson_hand_values_and_constant_images():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert M.pearson_r(np.array([[1.0, 3.0], [2.0, 4.0]]), x) == pytest.approx(0.8)
    assert M.pearson_r(2 * x + 5, x) == pytest.approx(1.0)
    assert M.pearson_r(-x, x) == pytest.approx(-1.0)
    assert M.pearson_r(np.ones((2, 2)), x) == 0.0
    assert M.pearson_r(np.ones((2, 2)), np.ones((2, 2))) == 0.0


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_ssim_matches_scikit_image(kind):
    rng = np.random.default_rng(1)
    if kind == "random":
        true = rng.random((40, 36))
    else:
        true, _ = _lattice(shape=(48, 40))
    pred = true + 0.15 * np.ptp(true) * rng.standard_normal(true.shape)
    ref_kwargs = dict(data_range=np.ptp(true), gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    assert M.ssim(pred, true, mode="reflect") == pytest.approx(skimage_ssim(pred, true, **ref_kwargs), abs=1e-12)
    # The periodic default equals scikit-image on the map padded periodically by the 5 px window radius.
    padded = [np.pad(a, 5, mode="wrap") for a in (pred, true)]
    assert M.ssim(pred, true) == pytest.approx(skimage_ssim(*padded, **ref_kwargs), abs=1e-12)


def test_ssim_hand_values():
    true = np.full((12, 12), 2.0)
    assert M.ssim(true, true) == pytest.approx(1.0)
    # Constant maps: sigma terms vanish, SSIM = (2ab + C1)/(a^2 + b^2 + C1), R = |2|.
    c1 = (0.01 * 2.0) ** 2
    assert M.ssim(np.full((12, 12), 1.0), true) == pytest.approx((4 + c1) / (5 + c1))
    value, smap = M.ssim(true, true, full=True)
    assert smap.shape == true.shape and value == pytest.approx(1.0)


def test_fit_affine_recovers_scale_and_offset():
    est = np.random.default_rng(0).standard_normal((8, 8))
    scale, offset = M.fit_affine(est, 3.0 * est + 2.0)
    assert (scale, offset) == pytest.approx((3.0, 2.0))


def test_column_error_recovers_known_shift():
    true, centres = _lattice()
    shift = np.zeros_like(centres)
    shift[:, 1] = 0.1   # every column moved 0.1 A along x
    pred, _ = _lattice(shifts_A=shift)
    res = M.column_position_error(pred, true, pixel_size_A=0.25)
    assert res.n_true == len(centres) == res.n_matched
    assert res.recall == 1.0 and res.precision == 1.0
    assert res.mean_error_A == pytest.approx(0.1, abs=0.02)
    assert res.rms_error_A == pytest.approx(0.1, abs=0.02)


def test_column_error_mixed_shifts_and_periodic_wrap():
    true, centres = _lattice()
    rng = np.random.default_rng(3)
    angles = rng.uniform(0, 2 * np.pi, len(centres))
    sizes = rng.uniform(0.05, 0.2, len(centres))
    shifts = np.stack([sizes * np.sin(angles), sizes * np.cos(angles)], axis=1)
    shifts[0] = [-1.1, 0.0]   # column at y = 1.0 A moves across the top edge to y = -0.1 (wraps)
    pred, _ = _lattice(shifts_A=shifts)
    res = M.column_position_error(pred, true, pixel_size_A=(0.25, 0.25))
    expected = np.hypot(shifts[:, 0], shifts[:, 1])
    assert res.n_matched == len(centres)
    assert res.mean_error_A == pytest.approx(expected.mean(), abs=0.03)


def test_column_error_missing_column_lowers_recall():
    true, centres = _lattice()
    shifts = np.zeros_like(centres)
    pred, _ = _lattice(shifts_A=shifts)
    y, x = np.mgrid[0:64, 0:64] * 0.25
    cy, cx = centres[5]
    pred -= np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * 0.35 ** 2))   # erase one column
    res = M.column_position_error(pred, true, pixel_size_A=0.25)
    assert res.n_matched == len(centres) - 1
    assert res.recall == pytest.approx((len(centres) - 1) / len(centres))
    assert res.mean_error_A < 0.02


def test_column_error_unresolved_is_none():
    flat = np.ones((16, 16))
    true, _ = _lattice(shape=(16, 16))
    res = M.column_position_error(flat, true, pixel_size_A=0.25)
    assert res.n_pred == 0 and res.n_matched == 0 and res.mean_error_A is None and res.recall == 0.0


def test_bootstrap_ci():
    rng = np.random.default_rng(0)
    values = rng.normal(5.0, 2.0, 400)
    ci = M.bootstrap_ci(values, n_resamples=2000, level=0.95, seed=1)
    assert ci.low < ci.value < ci.high
    assert ci.value == pytest.approx(values.mean())
    # Percentile bootstrap of a mean: half-width close to 1.96 sigma / sqrt(n).
    assert (ci.high - ci.low) / 2 == pytest.approx(1.96 * values.std() / 20, rel=0.15)
    assert M.bootstrap_ci(values, seed=1) == M.bootstrap_ci(values, seed=1)
    one = M.bootstrap_ci([3.0, None, math.inf])
    assert (one.value, one.low, one.high, one.n, one.n_nonfinite) == (3.0, 3.0, 3.0, 1, 2)
    assert M.bootstrap_ci([]).value is None
    med = M.bootstrap_ci([1.0, 2.0, 100.0], statistic="median")
    assert med.value == 2.0


def test_nonnegative_fit_never_flips_the_sign():
    """A baseline map that is the truth upside down gets scale 0 (the best constant), not -1; the
    signed scale is reported beside the fit."""
    from evaluation.baselines import fit_to_truth

    true, _ = _lattice(shape=(24, 24))
    fitted, fit = fit_to_truth(-true, true)
    assert fit["scale"] == 0.0 and fit["signed_scale"] == pytest.approx(-1.0)
    assert fit["offset"] == pytest.approx(true.mean())
    best_constant = M.relative_l2(np.full_like(true, true.mean()), true)
    assert M.relative_l2(fitted, true) == pytest.approx(best_constant, rel=1e-6)
    assert M.fit_affine(-true, true)[0] == pytest.approx(-1.0)   # what the unconstrained fit would have used
    # a map that already fits with a positive scale is fitted as before
    fitted, fit = fit_to_truth(0.5 * true - 3.0, true)
    assert (fit["scale"], fit["signed_scale"]) == pytest.approx((2.0, 2.0))
    assert M.relative_l2(fitted, true) == pytest.approx(0.0, abs=1e-6)


def _materials_with_correlated_samples(n_materials: int, per_material: int, seed: int = 0):
    """Values whose spread is mostly between materials (a material effect of sd 1, noise of sd 0.05)."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0.0, 1.0, n_materials)
    values = np.repeat(effect, per_material) + rng.normal(0.0, 0.05, n_materials * per_material)
    return values, [f"m{i}" for i in range(n_materials) for _ in range(per_material)]


def test_bootstrap_over_materials_is_wider_when_samples_of_a_material_are_alike():
    values, materials = _materials_with_correlated_samples(20, 4)
    by_sample = M.bootstrap_ci(values, n_resamples=4000, seed=3)
    by_material = M.bootstrap_ci(values, n_resamples=4000, seed=3, groups=materials)
    assert by_material.value == by_sample.value == pytest.approx(values.mean())
    assert by_material.n == 80 and by_material.n_groups == 20 and by_sample.n_groups is None
    # 20 independent materials, not 80 independent samples: about sqrt(4) = 2x wider
    width = (by_material.high - by_material.low) / (by_sample.high - by_sample.low)
    assert 1.6 < width < 2.4
    assert M.bootstrap_ci(values, seed=3, groups=materials) == M.bootstrap_ci(values, seed=3, groups=materials)


def test_bootstrap_over_materials_with_one_sample_each_is_the_sample_bootstrap():
    values = np.random.default_rng(5).normal(2.0, 1.0, 60)
    materials = [f"m{i}" for i in range(60)]
    by_sample = M.bootstrap_ci(values, n_resamples=20000, seed=1)
    by_material = M.bootstrap_ci(values, n_resamples=20000, seed=2, groups=materials)
    half = (by_sample.high - by_sample.low) / 2
    assert by_material.low == pytest.approx(by_sample.low, abs=0.05 * half)
    assert by_material.high == pytest.approx(by_sample.high, abs=0.05 * half)


def test_bootstrap_over_materials_edge_cases():
    # non-finite values are left out with their group; one material left gives no interval
    one = M.bootstrap_ci([1.0, 2.0, None, math.inf], groups=["a", "a", "b", "b"])
    assert (one.value, one.low, one.high, one.n, one.n_nonfinite, one.n_groups) == (1.5, 1.5, 1.5, 2, 2, 1)
    with pytest.raises(ValueError, match="one group label per value"):
        M.bootstrap_ci([1.0, 2.0], groups=["a"])
    with pytest.raises(ValueError, match="mean only"):
        M.bootstrap_ci([1.0, 2.0], statistic="median", groups=["a", "b"])


def test_level_and_contrast_split_the_relative_error():
    """rel_l2^2 = level^2 + contrast^2; a uniform offset is all level, a zero-mean error all contrast,
    and an affinely fitted map (the baselines') has no level error left."""
    rng = np.random.default_rng(3)
    truth = 5.0 + rng.random((16, 16))
    pred = truth + 0.3 + 0.2 * rng.standard_normal((16, 16))
    parts = M.level_and_contrast(pred, truth)
    assert parts["rel_l2_level"] ** 2 + parts["rel_l2_contrast"] ** 2 == pytest.approx(M.relative_l2(pred, truth) ** 2)
    offset = M.level_and_contrast(truth + 0.5, truth)
    assert offset["rel_l2_contrast"] == pytest.approx(0.0, abs=1e-12)
    assert offset["rel_l2_level"] == pytest.approx(M.relative_l2(truth + 0.5, truth))
    wiggle = rng.standard_normal((16, 16))
    assert M.level_and_contrast(truth + wiggle - wiggle.mean(), truth)["rel_l2_level"] == pytest.approx(0.0, abs=1e-12)
    scale, off, _ = M.fit_affine_nonnegative(pred, truth)
    assert M.level_and_contrast(scale * pred + off, truth)["rel_l2_level"] == pytest.approx(0.0, abs=1e-9)
