"""A scintillator camera's point spread (issue 42, item 2): given as ``--detector-psf-px``, every pattern is
deconvolved (stage.microscope.point_spread, Richardson-Lucy) after the camera's counts are restored and
before the checks and the model read it; without it, the camera-noise finding names the flag. The
recordings are namsa.camera's (tests/test_camera_noise.py's scintillator: gain 10, read noise 2 counts)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from microscope_helpers import CAMERA_FOUND, CAMERA_STEP, SCINTILLATOR, disc_scan
from namsa.camera import CameraSettings, record
from stage.microscope import ExperimentalInputError, RawScan, checks
from stage.microscope.point_spread import blur, deconvolve

STEP, FOUND = CAMERA_STEP, CAMERA_FOUND


@pytest.fixture(scope="module")
def discs():
    return disc_scan((16, 16), 32, radius=4.6).astype(np.float64)


def _codes(report):
    return {w["code"]: w["message"] for w in report["warnings"]}


def _relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_deconvolution_sharpens_a_blurred_disc_and_keeps_its_total(discs):
    pattern = discs[0, 0]
    blurred = blur(pattern, 1.0)
    restored = deconvolve(blurred, 1.0)
    assert _relative(restored, pattern) < 0.75 * _relative(blurred, pattern)
    assert restored.min() >= 0.0 and restored.sum() == pytest.approx(pattern.sum(), rel=0.01)
    assert np.array_equal(deconvolve(blurred, 1.0, iterations=0), np.maximum(blurred, 1e-6))
    assert np.array_equal(blurred, blur(pattern, 1.0))   # the caller's array is left as it was


def test_a_scintillators_scan_deconvolved_comes_closer_to_the_counted_one(discs):
    """The mean pattern's disc and its edge (within 8 px of the centre) of a scintillator's scan (sigma 1 px)
    restored and deconvolved with its sigma lie closer to the counted scan's than restored alone (the dark
    field differs by the clipped read noise, which no deconvolution changes); the total is kept."""
    counted = record(discs, STEP, CameraSettings(dose_e_per_A2=1e4, seed=1)).mean(axis=(0, 1))
    frames = record(discs, STEP, CameraSettings(dose_e_per_A2=1e4, seed=1, **SCINTILLATOR))
    _, plain, calib_plain = checks.check_before_inference(RawScan(frames, FOUND, "scint.hspy"), {})
    _, report, calib = checks.check_before_inference(RawScan(frames, FOUND, "scint.hspy"), {"detector_psf_px": 1.0})
    assert calib.counts.psf_sigma_px == 1.0 and calib_plain.counts.psf_sigma_px == 0.0
    sharp = calib.counts.restore(frames).mean(axis=(0, 1)) / 10.0
    soft = calib_plain.counts.restore(frames).mean(axis=(0, 1)) / 10.0
    k = np.arange(32) - 16
    disc = np.hypot(*np.meshgrid(k, k, indexing="ij")) < 8
    assert _relative(sharp[disc], counted[disc]) < 0.8 * _relative(soft[disc], counted[disc])
    assert sharp.sum() == pytest.approx(soft.sum(), rel=0.01)
    assert "--detector-psf-px 1" in _codes(report)["camera-psf"]
    assert "--detector-psf-px" in _codes(plain)["camera-noise"] and "camera-psf" not in _codes(plain)


def test_a_point_spread_given_for_counted_data_is_applied_and_said(discs):
    frames = record(discs, STEP, CameraSettings(dose_e_per_A2=1e4, seed=2))
    _, report, calib = checks.check_before_inference(RawScan(frames, FOUND, "counts.mib"), {"detector_psf_px": 0.8})
    assert calib.counts.psf_sigma_px == 0.8 and calib.counts.electrons and "camera-psf" in _codes(report)
    assert report["measured"]["dose_e_per_A2"]["value"] == pytest.approx(1e4, rel=0.02)


@pytest.mark.parametrize("sigma", [12.0, -1.0, float("nan")])
def test_a_point_spread_no_camera_has_is_refused_in_one_line(discs, sigma):
    frames = record(discs, STEP, CameraSettings(dose_e_per_A2=1e4, seed=3, **SCINTILLATOR))
    with pytest.raises(ExperimentalInputError, match="--detector-psf-px") as err:
        checks.check_before_inference(RawScan(frames, FOUND, "scint.hspy"), {"detector_psf_px": sigma})
    assert "\n" not in str(err.value) and "detector pixels" in str(err.value)


def test_the_cli_takes_the_point_spread_and_refuses_zero(capsys):
    from workflow.cli import build_parser

    args = build_parser().parse_args(["reconstruct", "scan.hspy", "--model", "pretrained:study-scan", "--out", "o",
                                      "--detector-psf-px", "1.2"])
    assert args.detector_psf_px == 1.2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["reconstruct", "scan.hspy", "--model", "m", "--out", "o", "--detector-psf-px", "0"])
    assert "--detector-psf-px" in capsys.readouterr().err


def test_the_flagship_on_a_scintillators_si_scan_comes_within_1_3x_of_counts_with_its_point_spread(tmp_path):
    """Si [001] (benchmarks/bench_camera_noise.py's scan, 1e4 e/A^2): through a scintillator the flagship's
    map was 1.57x the counted scan's error (field's rule); deconvolved from the camera's sigma it is within
    the issue's 1.3x, and better than without."""
    import namsa
    from evaluation.metrics import relative_l2
    from evaluation.views import field_map
    from stage.microscope import ScanCalibrations, write_scan
    from workflow.reconstruct import reconstruct

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32)
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    step = (sample.meta.fov_A[2] / 32, sample.meta.fov_A[3] / 32)
    cbed, truth = sample.cbed.reshape(32, 32, 32, 32), sample.potential
    calibrations = ScanCalibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=sample.meta.pattern_dk_inv_A,
                                    step_A=step)

    def error(camera: dict, psf: float | None, name: str) -> float:
        path = tmp_path / f"{name}.hspy"
        write_scan(path, record(cbed, step, CameraSettings(dose_e_per_A2=1e4, seed=1, **camera)), calibrations)
        reconstruct(path, "pretrained:study-scan-camera", tmp_path / name, calibrations={"detector_psf_px": psf})
        info = json.loads((tmp_path / name / "reconstruction.json").read_text())
        assert ("camera-psf" in _codes(info["checks"]["before"])) == (psf is not None)
        return relative_l2(field_map(np.load(tmp_path / name / "potential.npy"), truth), truth)

    counts, plain, sharp = error({}, None, "counts"), error(SCINTILLATOR, None, "plain"), error(SCINTILLATOR, 1.0, "psf")
    assert sharp < plain and sharp < 1.3 * counts, (counts, plain, sharp)


def test_a_large_block_is_deconvolved_in_chunks_within_a_bounded_extra_memory(monkeypatch):
    """A reconstruction's block is sized to --memory-gb with one float64 copy; the iteration's four copies
    are of one chunk at a time (here 1 MiB of a 24 MiB block), and the result equals the whole-block one."""
    import tracemalloc

    import stage.microscope.point_spread as point_spread

    rng = np.random.default_rng(0)
    block = rng.poisson(3.0, size=(48, 64, 32, 32)).astype(np.float64)
    whole = point_spread._richardson_lucy(block[:2].reshape(-1, 32, 32), 1.0, 3)
    monkeypatch.setattr(point_spread, "CHUNK_BYTES", 1 << 20)
    tracemalloc.start()
    out = deconvolve(block, 1.0, iterations=3, in_place=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out is block and peak < 8 << 20, peak   # in place; a few chunks, not copies of the 24 MiB block
    np.testing.assert_allclose(out[:2].reshape(-1, 32, 32), whole, rtol=1e-12)


def test_a_strided_block_asked_for_in_place_is_still_deconvolved():
    """A transposed (non-contiguous) float64 block cannot be reshaped as a view: it is copied once and the
    result returned, not written through a temporary copy and lost."""
    block = np.random.default_rng(1).poisson(50.0, size=(4, 6, 16, 16)).astype(np.float64)
    strided = block.transpose(1, 0, 2, 3)
    expected = deconvolve(np.ascontiguousarray(strided), 1.0)
    out = deconvolve(strided, 1.0, in_place=True)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    assert not np.allclose(out, strided)
