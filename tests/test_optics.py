"""Electron optics: wavelength, interaction constant, probe, aperture, sampling checks, scan grid."""
from __future__ import annotations

import numpy as np
import pytest

from namsa import UserError
from namsa.constants import interaction_constant, wavelength_A
from namsa.optics import (aberration_phase, band_limit_mask, check_sampling, probe_fourier,
                          required_sampling_A, scan_positions, shift_phases)


@pytest.mark.parametrize("kv, lam, sigma", [
    # Kirkland (2010) Table 2.2 / eq. 5.6: lambda (Angstrom), sigma (rad / (V Angstrom))
    (100.0, 0.03701, 9.244e-4),
    (200.0, 0.02508, 7.288e-4),
    (300.0, 0.01969, 6.526e-4),
])
def test_wavelength_and_sigma_textbook(kv, lam, sigma):
    assert wavelength_A(kv) == pytest.approx(lam, abs=1e-5)
    assert interaction_constant(kv) == pytest.approx(sigma, rel=1e-3)


def test_probe_normalised_in_real_space():
    gpts, sampling = (96, 90), (0.1, 0.11)
    psi_k = probe_fourier(gpts, sampling, 200.0, 20.0, C1_A=-50.0, C3_mm=1.0)
    psi = np.fft.ifft2(psi_k)
    assert (np.abs(psi) ** 2).sum() == pytest.approx(1.0, rel=1e-10)


def test_aperture_radius_and_soft_edge():
    gpts, sampling = (256, 256), (0.05, 0.05)
    psi_k = probe_fourier(gpts, sampling, 200.0, 20.0)
    amp = np.abs(psi_k) / np.abs(psi_k).max()
    dk = 1.0 / (gpts[0] * sampling[0])
    lam = wavelength_A(200.0)
    # area-equivalent radius of the disc equals the semi-angle to a fraction of a pixel
    radius_mrad = np.sqrt(amp.sum() * dk * dk / np.pi) * lam * 1e3
    assert radius_mrad == pytest.approx(20.0, abs=0.5 * dk * lam * 1e3)
    # soft edge: partial transmission only within one pixel of the cutoff
    ky, kx = np.meshgrid(np.fft.fftfreq(gpts[0], sampling[0]), np.fft.fftfreq(gpts[1], sampling[1]), indexing="ij")
    alpha_mrad = np.sqrt(ky ** 2 + kx ** 2) * lam * 1e3
    partial = (amp > 1e-6) & (amp < 1 - 1e-6)
    assert partial.any()
    assert np.abs(alpha_mrad[partial] - 20.0).max() <= dk * lam * 1e3


def test_aberration_phase_defocus_and_cs():
    lam = wavelength_A(200.0)
    alpha = np.array([0.0, 0.01])
    chi = aberration_phase(alpha, lam, C1_A=-100.0, C3_mm=0.0)
    assert chi[1] == pytest.approx(2 * np.pi / lam * 0.5 * -100.0 * 1e-4)
    chi3 = aberration_phase(alpha, lam, C3_mm=1.0)
    assert chi3[1] == pytest.approx(2 * np.pi / lam * 0.25 * 1e7 * 1e-8)


def test_sampling_too_coarse_explains_the_requirement():
    need = required_sampling_A(200.0, 20.0, 2 / 3)
    assert need == pytest.approx(2 / 3 * 0.02508 / 0.04, rel=1e-3)
    check_sampling((need * 0.99, need * 0.99), 200.0, 20.0, 2 / 3)
    with pytest.raises(UserError, match=r"too coarse.*sampling_A <= 0\.41"):
        check_sampling((0.5, 0.5), 200.0, 20.0, 2 / 3)


def test_band_limit_mask_is_two_thirds_of_nyquist():
    mask = band_limit_mask((64, 64), (0.1, 0.1), 2 / 3)
    k = np.fft.fftfreq(64, 0.1)
    kept_on_axis = k[mask[0] > 0]
    assert np.abs(kept_on_axis).max() < 2 / 3 * 5.0 <= np.abs(kept_on_axis).max() + 1 / 6.4


def test_scan_positions_row_major_endpoint_exclusive():
    pos = scan_positions((1.0, 2.0, 4.0, 8.0), (2, 4))
    assert pos.shape == (8, 2)
    np.testing.assert_allclose(pos[1], [1.0, 4.0])   # same row, next column
    np.testing.assert_allclose(pos[4], [3.0, 2.0])   # next row
    np.testing.assert_allclose(pos[-1], [3.0, 8.0])


def test_shift_phases_move_the_probe():
    gpts, sampling = (64, 64), (0.2, 0.2)
    psi_k = probe_fourier(gpts, sampling, 200.0, 25.0)
    py, px = shift_phases([[3.0, 5.0]], gpts, sampling)
    psi = np.fft.ifft2(psi_k * py[0][:, None] * px[0][None, :])
    peak = np.unravel_index(np.argmax(np.abs(psi)), gpts)
    assert peak == (15, 25)
