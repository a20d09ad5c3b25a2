"""namsa.camera: what a detector records of namsa's patterns (counts, gain, dark noise, MTF, descan,
scan rotation), checked against the statistics each step must have and against what
stage.microscope.autocal measures back from the frames."""
from __future__ import annotations

import math

import numpy as np
import pytest

from microscope_helpers import simulated_scan
from namsa.camera import CameraSettings, CameraSettingsError, electrons_per_pattern, record
from namsa.errors import UserError
from stage.microscope import autocal
from stage.microscope.disc import find_disc

STEP = (0.5, 0.5)


@pytest.fixture(scope="module")
def sim():
    return simulated_scan()  # GaAs [011], 8 x 8 scan, 32 px patterns at the study's physics


def _flat(px: int = 32, scan: tuple[int, int] = (16, 16)) -> np.ndarray:
    """Patterns of uniform intensity carrying 1 each (a flat field)."""
    return np.full((*scan, px, px), 1.0 / px ** 2)


def test_counts_are_poisson_electrons_of_the_dose_and_repeat_with_the_seed(sim):
    data, _ = sim
    settings = CameraSettings(dose_e_per_A2=400.0, seed=3)
    frames = record(data, STEP, settings)
    assert frames.dtype == np.uint16 and frames.shape == data.shape
    n = electrons_per_pattern(400.0, STEP)
    expected = data.sum(axis=(2, 3)) * n
    totals = frames.sum(axis=(2, 3), dtype=np.float64)
    z = (totals.sum() - expected.sum()) / math.sqrt(expected.sum())
    assert abs(z) < 4, z                                   # the mean is the dose's
    assert np.var(totals - expected) == pytest.approx(expected.mean(), rel=0.4)   # Poisson spread
    np.testing.assert_array_equal(record(data, STEP, settings), frames)
    assert not np.array_equal(record(data, STEP, CameraSettings(dose_e_per_A2=400.0, seed=4)), frames)


def test_gain_scales_and_read_noise_adds_without_changing_the_electrons(sim):
    data, _ = sim
    plain = record(data, STEP, CameraSettings(dose_e_per_A2=100.0, seed=1)).astype(np.float64)
    gained = record(data, STEP, CameraSettings(dose_e_per_A2=100.0, gain_counts_per_electron=7.5, seed=1))
    assert gained.dtype == np.float32
    np.testing.assert_allclose(gained, 7.5 * plain, rtol=1e-6)
    noisy = record(data, STEP, CameraSettings(dose_e_per_A2=100.0, gain_counts_per_electron=7.5,
                                              read_noise_counts=3.0, seed=1))
    noise = noisy - gained
    assert abs(noise.mean()) < 0.05 and noise.std() == pytest.approx(3.0, rel=0.02)
    assert noisy.min() < 0                                 # dark-subtracted: zero-mean noise dips below 0


def _neighbour_correlation(frames: np.ndarray) -> float:
    """Correlation of the fluctuations of horizontally neighbouring pixels (away from the edges)."""
    f = frames.astype(np.float64)[..., 4:-4, 4:-4]
    f = f - f.mean(axis=(0, 1))
    return float((f[..., :-1] * f[..., 1:]).mean() / f.var())


def test_a_counting_detector_keeps_white_noise_and_a_scintillator_blurs_it():
    """Counting: each electron lands in one pixel, so a flat field's pixels fluctuate independently
    with the Poisson variance; a scintillator's light spread correlates neighbours and lowers it."""
    flat = _flat()
    counting = record(flat, STEP, CameraSettings(dose_e_per_A2=4000.0, mtf="counting", seed=2))
    mean = counting.mean()
    assert counting.var(axis=(0, 1)).mean() == pytest.approx(mean, rel=0.1)
    assert abs(_neighbour_correlation(counting)) < 0.05
    blurred = record(flat, STEP, CameraSettings(dose_e_per_A2=4000.0, mtf="scintillator", scintillator_sigma_px=1.0,
                                                seed=2))
    assert blurred.dtype == np.float32 and _neighbour_correlation(blurred) > 0.5
    assert blurred.var(axis=(0, 1)).mean() < 0.3 * mean    # a Gaussian of 1 px: variance / (4 pi sigma^2)


def test_the_counting_mtf_is_the_pixel_aperture():
    """The mean recorded frame is the pattern filtered by sinc(fy) sinc(fx): on a textured pattern
    (power at every frequency) at a dose whose shot noise is 1e-4 of a pixel, its spectrum over the
    pattern's is the MTF."""
    texture = np.random.default_rng(0).uniform(0.5, 1.5, (32, 32))
    patterns = np.broadcast_to(texture / texture.sum(), (4, 4, 32, 32))
    got = record(patterns, STEP, CameraSettings(dose_e_per_A2=1e12, mtf="counting"))
    assert got.dtype == np.uint32                               # 2.4e8 counts a pixel: beyond uint16
    mean = got.astype(np.float64).mean(axis=(0, 1)) / electrons_per_pattern(1e12, STEP)
    ratio = np.abs(np.fft.rfft2(mean)) / np.abs(np.fft.rfft2(texture / texture.sum()))
    fy, fx = np.fft.fftfreq(32)[:, None], np.fft.rfftfreq(32)[None, :]
    np.testing.assert_allclose(ratio, np.sinc(fy) * np.sinc(fx), atol=0.03)
    assert ratio[0, 16] == pytest.approx(2 / np.pi, abs=0.03)   # Nyquist along kx


@pytest.mark.parametrize("angle", [30.0, 250.0])
def test_the_scan_rotation_is_the_one_autocal_fits(sim, angle):
    data, _ = sim
    frames = record(data, STEP, CameraSettings(dose_e_per_A2=1e6, scan_rotation_deg=angle, seed=5))
    disc = find_disc(autocal.subsample(frames).mean(axis=0))
    cal = autocal.calibrate(frames, disc, autocal.scan_scalars(frames, disc))
    assert cal.rotation.flip is False
    assert (cal.rotation.angle_deg - angle + 180.0) % 360.0 - 180.0 == pytest.approx(0.0, abs=5.0), cal.rotation


def test_the_descan_is_a_shift_linear_in_the_scan_position_that_autocal_measures(sim):
    data, _ = sim
    descan = ((0.5, -0.3), (0.2, 0.4))   # px per Angstrom: [[dky/dy, dky/dx], [dkx/dy, dkx/dx]]
    frames = record(data, STEP, CameraSettings(dose_e_per_A2=1e6, descan_px_per_A=descan, detector_px=40, seed=6))
    assert frames.shape == (8, 8, 40, 40)
    disc = find_disc(autocal.subsample(frames).mean(axis=0))
    plane = autocal.calibrate(frames, disc, autocal.scan_scalars(frames, disc)).descan
    per_step = np.asarray(descan) * STEP[0]
    assert plane.slope_y == pytest.approx(tuple(per_step[:, 0]), abs=0.05)
    assert plane.slope_x == pytest.approx(tuple(per_step[:, 1]), abs=0.05)
    assert plane.origin == pytest.approx((20.0, 20.0), abs=0.3)       # k = 0 at D // 2 at the first position


@pytest.mark.parametrize("bad, says", [(dict(dose_e_per_A2=0.0), "dose_e_per_A2=0.0"),
                                       (dict(dose_e_per_A2=1.0, gain_counts_per_electron=-1.0), "positive gain"),
                                       (dict(dose_e_per_A2=1.0, mtf="ccd"), "one of none, counting, scintillator"),
                                       (dict(dose_e_per_A2=1.0, seed=-1), "seed=-1"),
                                       (dict(dose_e_per_A2=float("nan")), "dose_e_per_A2=nan"),
                                       (dict(dose_e_per_A2=1.0, scan_rotation_deg=float("inf")), "finite")])
def test_bad_settings_are_one_line_user_errors(bad, says):
    with pytest.raises(UserError, match=says) as info:
        CameraSettings(**bad)
    assert isinstance(info.value, CameraSettingsError) and "\n" not in str(info.value)


def test_a_detector_smaller_than_the_patterns_is_refused(sim):
    data, _ = sim
    with pytest.raises(CameraSettingsError, match="smaller than the 32 px patterns"):
        record(data, STEP, CameraSettings(dose_e_per_A2=1.0, detector_px=16))
