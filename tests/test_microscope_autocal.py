"""Calibration from the data (stage.microscope.autocal) on real namsa simulations: the disc and the
semi-angle it implies, a known descan plane, known 90-degree rotations and a flip of the patterns
against the scan, each recovered and undone by `recentre`; and every read is a bounded slice."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from microscope_helpers import simulated_scan
from namsa.constants import wavelength_A
from stage.microscope import autocal
from stage.microscope.disc import find_disc


@pytest.fixture(scope="module")
def sim():
    return simulated_scan()


def _calibrate(data):
    disc = find_disc(autocal.subsample(data).mean(axis=0))
    return autocal.calibrate(data, disc, autocal.scan_scalars(data, disc))


def test_semiangle_recovered_from_the_disc(sim):
    data, meta = sim
    disc = find_disc(autocal.subsample(data).mean(axis=0))
    semi, err = autocal.semiangle_from_disc(disc, meta.pattern_dk_inv_A, meta.energy_kv)
    assert err > 0
    assert abs(semi - meta.semiangle_mrad) < 0.1 * meta.semiangle_mrad, (semi, err)
    assert disc.centre_px == pytest.approx((16.0, 16.0), abs=0.3)


@pytest.mark.parametrize("turns,flip", [(0, False), (1, False), (2, False), (3, False), (0, True), (1, True)])
def test_rotation_and_flip_recovered_and_undone(sim, turns, flip):
    data, _ = sim
    seen = np.swapaxes(data, 2, 3) if flip else data
    seen = np.ascontiguousarray(np.rot90(seen, turns, axes=(2, 3)))
    cal = _calibrate(seen)
    assert cal.rotation.flip == flip
    # np.rot90 turns a (ky, kx) vector by R(+90 degrees) per turn, so the patterns were turned by
    # T = R(90 t) (after the swap P when flipped); the fit is its inverse: R(-90 t), or P R(-90 t) = R(90 t) P
    expected = 90.0 * turns if flip else -90.0 * turns
    assert (cal.rotation.angle_deg - expected + 3.0) % 360.0 < 6.0, cal.rotation
    back = cal.recentre(seen, 0, 0)
    assert np.linalg.norm(back - data) / np.linalg.norm(data) < 0.05


def test_descan_plane_recovered_and_removed(sim):
    data, _ = sim
    slope_y, slope_x = (0.25, -0.1), (-0.15, 0.2)  # px of beam shift per scan step [ky, kx]
    shifted = np.empty_like(data)
    for i in range(8):
        for j in range(8):
            shift = [slope_y[k] * i + slope_x[k] * j - 0.8 for k in (0, 1)]
            shifted[i, j] = ndimage.shift(data[i, j], shift, order=1, mode="nearest")
    cal = _calibrate(shifted)
    assert cal.descan.slope_y == pytest.approx(slope_y, abs=0.05)
    assert cal.descan.slope_x == pytest.approx(slope_x, abs=0.05)
    assert cal.descan.residual_rms_px < 0.3
    assert cal.rotation.flip is False and min(cal.rotation.angle_deg, 360 - cal.rotation.angle_deg) < 5
    back = cal.recentre(shifted, 0, 0)
    # two linear interpolations (the shift above and recentre) blur the sharp disc edge by ~10%;
    # the beam centres must come back to where they were (a thresholded disc's centroid moves in
    # steps of a fraction of a pixel per pattern, so the mean is held tighter than the largest)
    assert np.linalg.norm(back - data) / np.linalg.norm(data) < 0.15
    disc = cal.disc
    before, after = (autocal.scan_scalars(d, disc).centre for d in (data, back))
    assert np.abs(after - before).mean() < 0.1 and np.abs(after - before).max() < 0.5


def test_recentre_of_a_block_is_the_block_of_the_whole(sim):
    data, _ = sim
    cal = _calibrate(np.ascontiguousarray(np.rot90(data, 1, axes=(2, 3))))
    seen = np.ascontiguousarray(np.rot90(data, 1, axes=(2, 3)))
    whole = cal.recentre(seen, 0, 0)
    np.testing.assert_allclose(cal.recentre(seen[2:5, 3:7], 2, 3), whole[2:5, 3:7])


class SliceOnly:
    """A lazy-array stand-in: numpy slicing works, loading the whole dataset fails the test."""

    def __init__(self, data: np.ndarray):
        self._data, self.shape, self.dtype = data, data.shape, data.dtype
        self.largest = 0

    def __getitem__(self, key):
        part = self._data[key]
        assert part.size < self._data.size or self._data.shape[0] == 1, "the whole scan was read at once"
        self.largest = max(self.largest, part.size)
        return part

    def __array__(self, *args, **kwargs):
        raise AssertionError("np.asarray on the whole scan")


def test_reads_are_bounded_slices(sim):
    data, _ = sim
    lazy = SliceOnly(data)
    disc = find_disc(autocal.subsample(lazy, 16).mean(axis=0))
    assert lazy.largest <= 16 * 32 * 32  # the strided subsample: 16 patterns
    lazy.largest = 0
    pattern_bytes = 32 * 32 * 8
    blocked = autocal.scan_scalars(lazy, disc, block_bytes=5 * pattern_bytes)
    assert lazy.largest <= 5 * 32 * 32  # blocks of at most 5 patterns, as the budget says
    whole = autocal.scan_scalars(data, disc)
    np.testing.assert_allclose(blocked.total, whole.total)
    np.testing.assert_allclose(blocked.centre, whole.centre)
    assert (blocked.max_value, blocked.n_at_max) == (whole.max_value, whole.n_at_max)


def test_report_gives_units_and_uncertainties(sim):
    data, meta = sim
    cal = _calibrate(data)
    cal.semiangle_mrad = autocal.semiangle_from_disc(cal.disc, meta.pattern_dk_inv_A, meta.energy_kv)
    report = cal.report()
    for name in ("disc_radius_px", "rotation_deg", "descan_slope_y_px", "semiangle_mrad"):
        assert report[name]["unit"] and "uncertainty" in report[name], name
    assert wavelength_A(200.0) == pytest.approx(0.02508, abs=1e-4)


def test_a_flat_field_gives_no_rotation_and_says_so():
    from microscope_helpers import disc_scan

    cal = _calibrate(disc_scan((8, 8), 32))
    assert (cal.rotation.angle_deg, cal.rotation.error_deg) == (0.0, 180.0)


def test_descan_correction_only_where_the_beam_is_off_centre_and_never_turns(sim):
    """What `namsa reconstruct` applies: nothing to a centred scan; to a descanned one, a shift
    of every pattern back to the centre, the fitted rotation left out (it is only reported)."""
    data, _ = sim
    assert _calibrate(data).descan_correction(data.shape[:2]) is None
    shifted = np.empty_like(data)
    for i in range(8):
        for j in range(8):
            shifted[i, j] = ndimage.shift(data[i, j], (0.2 * i - 0.8, 0.1 * j), order=1, mode="nearest")
    cal = _calibrate(np.ascontiguousarray(np.swapaxes(shifted, 2, 3)))   # also a flip the fit sees
    correct = cal.descan_correction(shifted.shape[:2])
    assert correct is not None and cal.rotation.flip
    back = correct(np.swapaxes(shifted, 2, 3), 0, 0)
    centres = autocal.scan_scalars(back, cal.disc).centre
    assert np.abs(centres - 16.0).max() < 0.5                            # every beam at the centre
    assert np.linalg.norm(back - np.swapaxes(data, 2, 3)) / np.linalg.norm(data) < 0.15   # shifted, not turned
