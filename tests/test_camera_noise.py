"""A camera's noise (issue 42, item 2): stage.microscope.noise measures gain, dark level and read noise
of namsa.camera's recordings (a photon-transfer curve over the scan), and the checks before inference
turn a camera's values into counts (stage.microscope.counts_restore) before anything reads them.

The patterns measured are uniform discs (tests/microscope_helpers.disc_scan: no specimen, as a scan
over vacuum or an amorphous film): the gain a photon-transfer curve gives is the camera's there. On a
strong crystal the specimen's change between probe positions biases it (the docstring of
counts_restore._decide), which is why only the dark level is applied to float data."""
from __future__ import annotations

import json

import numpy as np
import pytest

from microscope_helpers import CAMERA_FOUND, CAMERA_STEP, SCINTILLATOR, disc_scan
from namsa.camera import CameraSettings, electrons_per_pattern, record
from stage.microscope import ExperimentalInputError, RawScan, checks
from stage.microscope.noise import measure_noise

STEP, FOUND = CAMERA_STEP, CAMERA_FOUND


@pytest.fixture(scope="module")
def discs():
    return disc_scan((32, 32), 32, radius=4.6).astype(np.float64)


def _codes(report):
    return {w["code"] for w in report["warnings"]}


def _checked(frames):
    return checks.check_before_inference(RawScan(frames, FOUND, "camera.hspy"), {})


def test_a_counting_detector_reads_gain_one_and_stays_counts(discs):
    frames = record(discs, STEP, CameraSettings(dose_e_per_A2=1e4, seed=1))
    noise = measure_noise(frames)
    assert noise.trusted and noise.gain == pytest.approx(1.0, abs=0.1)
    assert noise.dark == 0.0 and noise.read_noise == 0.0 and noise.negative_fraction == 0.0
    assert noise.psf_sigma_px == 0.0 and noise.bin_px == 1 and noise.value_gcd == 1
    _, report, calib = _checked(frames)
    assert calib.counts is None and not {"camera-gain", "camera-noise"} & _codes(report)
    assert report["measured"]["dose_e_per_A2"]["value"] == pytest.approx(1e4, rel=0.02)


def test_a_gain_of_ten_in_whole_numbers_is_divided_out_before_the_dose_is_read(discs):
    frames = record(discs, STEP, CameraSettings(dose_e_per_A2=1e4, gain_counts_per_electron=10.0, seed=2))
    assert np.all(frames == np.round(frames))   # whole numbers: read as counts before issue 42 (10x the dose)
    noise = measure_noise(frames)
    assert noise.value_gcd == 10 and noise.gain == pytest.approx(10.0, rel=0.1)
    _, report, calib = _checked(frames)
    assert calib.counts.gain == 10.0 and "camera-gain" in _codes(report)
    assert report["measured"]["dose_e_per_A2"]["value"] == pytest.approx(1e4, rel=0.02)


def test_a_scintillator_with_gain_and_read_noise_is_measured(discs):
    """Gain 10 within 15% through the scintillator's point spread (sigma 1 px: one pixel's variance
    holds 8% of an electron's, so unbinned it would read ~0.8), read noise 2 within 10%, dark 0."""
    wide = disc_scan((32, 32), 32, radius=8.0).astype(np.float64)   # more bins of signal to fit
    noise = measure_noise(record(wide, STEP, CameraSettings(dose_e_per_A2=1e3, seed=3, **SCINTILLATOR)))
    assert noise.trusted and noise.gain == pytest.approx(10.0, rel=0.15)
    assert noise.read_noise == pytest.approx(2.0, rel=0.1) and abs(noise.dark) < 0.2
    assert 0.5 < noise.psf_sigma_px < 1.5 and noise.bin_px >= 2 and noise.negative_fraction > 0.1
    _, report, calib = _checked(record(discs, STEP, CameraSettings(dose_e_per_A2=1e3, seed=3, **SCINTILLATOR)))
    assert "camera-noise" in _codes(report) and abs(calib.counts.dark) < 0.2
    assert report["measured"]["camera_noise"]["read_noise"] == pytest.approx(2.0, rel=0.1)
    assert calib.counts.restore(np.array([-3.0, 0.0, 20.0])).min() == 0.0   # no negative reaches the model


def test_read_noise_alone_is_measured_and_its_dark_offset_removed(discs):
    frames = record(discs, STEP, CameraSettings(dose_e_per_A2=1e5, read_noise_counts=2.0, seed=4))
    offset = frames + np.float32(100.0)   # a camera that keeps its dark level (counts) in the file
    noise = measure_noise(offset)
    assert noise.gain == pytest.approx(1.0, rel=0.15) and noise.read_noise == pytest.approx(2.0, rel=0.1)
    assert noise.dark == pytest.approx(100.0, abs=0.2) and noise.negative_fraction == 0.0
    _, report, calib = _checked(offset)
    assert "camera-noise" in _codes(report) and calib.counts.dark == pytest.approx(100.0, abs=0.2)
    assert calib.counts.restore(offset[:1, :1]).mean() == pytest.approx(frames[:1, :1].clip(0).mean(), rel=0.05)


def test_negative_data_too_small_to_measure_are_refused_in_one_line(discs):
    frames = record(discs[:2, :4], STEP, CameraSettings(dose_e_per_A2=1e4, read_noise_counts=2.0, seed=5))
    with pytest.raises(ExperimentalInputError, match="too few to measure the camera's dark level") as err:
        _checked(frames)
    assert "\n" not in str(err.value)


def test_noise_free_data_in_arbitrary_units_are_named_not_converted(discs):
    _, report, calib = _checked(discs * 37.5)
    assert calib.counts is None and "arbitrary-units" in _codes(report)


def test_reconstruct_restores_a_scintillator_file_and_records_it(tmp_path):
    """`workflow.reconstruct.reconstruct` on a scintillator's .hspy (Si [001], 32 x 32 scan): the finding
    and the camera's measured noise in reconstruction.json, and the map's level near the truth's (5.6x
    before the dark-subtracted, non-negative patterns)."""
    import namsa
    from stage.microscope import ScanCalibrations, write_scan
    from workflow.reconstruct import reconstruct

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32)
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    step = (sample.meta.fov_A[2] / 32, sample.meta.fov_A[3] / 32)
    frames = record(sample.cbed.reshape(32, 32, 32, 32), step, CameraSettings(dose_e_per_A2=1e4, seed=6,
                                                                              **SCINTILLATOR))
    path = tmp_path / "scint.hspy"
    write_scan(path, frames, ScanCalibrations(energy_kv=200.0, semiangle_mrad=20.0,
                                              dk_inv_A=sample.meta.pattern_dk_inv_A, step_A=step))
    reconstruct(path, "pretrained:study-scan", tmp_path / "out", symmetry_average=False)
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    before = info["checks"]["before"]
    assert "camera-noise" in _codes(before)
    assert before["measured"]["camera_noise"]["read_noise"] == pytest.approx(2.0, rel=0.1)
    level = float(np.load(tmp_path / "out" / "potential.npy").mean() / sample.potential.mean())
    assert 0.5 < level < 3.0, level
    assert electrons_per_pattern(1e4, step) > 0
