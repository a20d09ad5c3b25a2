"""Microscope-like files, end to end: a namsa simulation at the study's physics (Si [001], 32 x 32
scan, 32 px patterns) recorded by a camera (namsa.camera: counts, gain, dark noise, MTF, descan,
scan rotation), written by stage.microscope.write_scan in each format `namsa reconstruct` reads, and
reconstructed by `pretrained:study-scan` through the CLI: the maps come back and the findings in
reconstruction.json are what the camera did (its dose, its descan corrected, its rotation, no dose
claimed for a camera with gain)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from namsa.camera import CameraSettings, record
from microscope_helpers import defocused_si_scan
from stage.microscope import ExperimentalInputError, ScanCalibrations, read_scan, write_scan

pytest.importorskip("rsciio")

#: px of beam shift per Angstrom of probe position: [[dky/dy, dky/dx], [dkx/dy, dkx/dx]] (~1.2 px
#: over the scan's 15 Angstrom: well above the 0.25 px the reconstruction corrects from)
DESCAN = ((0.06, 0.02), (-0.03, 0.05))
FLAGS = {"energy_kv": "--energy-kv", "semiangle_mrad": "--semiangle-mrad", "dk_inv_A": "--dk-inv-a",
         "step_A": "--scan-step-a"}


@pytest.fixture(scope="module")
def si():
    import namsa

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32)
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    m = sample.meta
    step = (m.fov_A[2] / 32, m.fov_A[3] / 32)
    cal = ScanCalibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=m.pattern_dk_inv_A, step_A=step)
    return sample.cbed.reshape(32, 32, 32, 32), sample.potential, cal


def _reconstruct(si: Any, path: Path, camera: CameraSettings) -> tuple[dict[str, Any], np.ndarray, float]:
    """Record, write, reconstruct with the flags for what the format does not keep; returns
    (reconstruction.json, the potential map, its correlation with the true potential)."""
    from workflow.cli import main

    cbed, truth, cal = si
    kept = write_scan(path, record(cbed, cal.step_A, camera), cal)
    flags: list[str] = []
    for name, flag in FLAGS.items():
        if name not in kept:
            value = getattr(cal, name)
            flags += [flag, ",".join(map(repr, value)) if isinstance(value, tuple) else repr(value)]
    out = path.parent / "out"
    assert main(["reconstruct", str(path), "--model", "pretrained:study-scan", "--out", str(out), *flags]) == 0
    info = json.loads((out / "reconstruction.json").read_text())
    potential = np.load(out / "potential.npy")
    assert potential.shape == truth.shape and np.isfinite(potential).all()
    assert np.isfinite(np.load(out / "icom_potential.npy")).all()
    return info, potential, float(np.corrcoef(potential.ravel(), truth.ravel())[0, 1])


def _codes(info: dict[str, Any]) -> set[str]:
    checks = info["checks"]
    return {w["code"] for w in checks["before"]["warnings"] + checks["after"]["warnings"]}


def _dose(info: dict[str, Any]) -> float | None:
    return (info["checks"]["before"]["measured"].get("dose_e_per_A2") or {}).get("value")


def _recentred(info: dict[str, Any]) -> bool:
    return any(note.startswith("patterns recentred") for note in info["resampling"])


def _angle(info: dict[str, Any]) -> float:
    return info["calibration_from_data"]["rotation_deg"]["value"]


def test_hspy_from_a_scintillator_camera_with_gain_noise_descan_and_rotation(si, tmp_path):
    camera = CameraSettings(dose_e_per_A2=5000.0, gain_counts_per_electron=7.3, read_noise_counts=2.0,
                            mtf="scintillator", scintillator_sigma_px=0.7, descan_px_per_A=DESCAN,
                            scan_rotation_deg=12.0, detector_px=40, seed=1)
    info, _, r = _reconstruct(si, tmp_path / "scan.hspy", camera)
    assert _dose(info) is None and "arbitrary-units" in _codes(info)   # a gain: no dose is claimed
    assert _recentred(info)
    assert (_angle(info) - 12.0 + 180) % 360 - 180 == pytest.approx(0.0, abs=3.0)
    assert r > 0.5, r


def test_zspy_of_a_counting_detector_at_30_electrons_per_square_angstrom(si, tmp_path):
    """The dose of issue 31's refusal: maps come back, with the one dose of the file and its warning."""
    info, _, _ = _reconstruct(si, tmp_path / "scan.zspy", CameraSettings(dose_e_per_A2=30.0, mtf="counting",
                                                                         detector_px=40, seed=2))
    assert _dose(info) == pytest.approx(30.0, rel=0.05)
    assert "dose" in _codes(info) and not _recentred(info)
    assert info["checks"]["before"]["measured"]["total_per_pattern"]["patterns_without_counts"] >= 0


def test_emd_of_a_counting_detector_at_a_trained_dose(si, tmp_path):
    info, _, r = _reconstruct(si, tmp_path / "scan.emd", CameraSettings(dose_e_per_A2=1e4, mtf="counting", seed=3))
    assert _dose(info) == pytest.approx(1e4, rel=0.03)
    assert "dose" not in _codes(info) and not _recentred(info)
    assert r > 0.85, r


def test_empad_with_dark_noise_and_descan(si, tmp_path):
    """EMPAD keeps the scan step and detector pixel, not the energy or angle (given as flags); its
    128 px frames are cropped around the recentred beam."""
    camera = CameraSettings(dose_e_per_A2=2000.0, read_noise_counts=0.5, descan_px_per_A=DESCAN, detector_px=40,
                            seed=4)
    info, _, _ = _reconstruct(si, tmp_path / "scan.xml", camera)
    assert info["calibrations"]["step_A"]["source"] == "file metadata"
    assert info["calibrations"]["energy_kv"]["source"] == "command line"
    assert _recentred(info) and "arbitrary-units" in _codes(info)
    slopes = info["calibration_from_data"]["descan_slope_y_px"]["value"]
    assert slopes == pytest.approx([DESCAN[0][0] * si[2].step_A[0], DESCAN[1][0] * si[2].step_A[0]], abs=0.01)


def test_mib_of_a_counting_detector_with_descan_and_rotation(si, tmp_path):
    camera = CameraSettings(dose_e_per_A2=300.0, mtf="counting", descan_px_per_A=DESCAN, scan_rotation_deg=-20.0,
                            detector_px=40, seed=5)
    info, _, _ = _reconstruct(si, tmp_path / "scan.mib", camera)
    assert {c["source"] for c in info["calibrations"].values()} == {"command line"}   # a .mib keeps none
    assert _dose(info) == pytest.approx(300.0, rel=0.05) and "dose" not in _codes(info)
    assert _recentred(info)
    assert (_angle(info) + 20.0 + 180) % 360 - 180 == pytest.approx(0.0, abs=3.0)


def test_arina_master_and_data_files(si, tmp_path):
    info, _, r = _reconstruct(si, tmp_path / "scan_master.h5", CameraSettings(dose_e_per_A2=1000.0, detector_px=36,
                                                                               seed=6))
    assert info["calibrations"]["step_A"]["source"] == "file metadata"
    assert _dose(info) == pytest.approx(1000.0, rel=0.03)
    assert r > 0.7, r


def test_the_zspy_layout_is_hyperspys(tmp_path):
    """The groups and attributes of a written .zspy are those rosettasciio's writer made in
    tests/data/hyperspy-written.zspy (same names, same axis attributes), and read back the same."""
    import zarr

    fixture = Path(__file__).resolve().parent / "data" / "hyperspy-written.zspy"
    data = np.load(fixture.with_suffix(".npy"))
    write_scan(tmp_path / "ours.zspy", data, ScanCalibrations(200.0, 20.0, 0.2, (-0.5, 0.5)))
    theirs = zarr.open_group(str(fixture), mode="r", zarr_format=2)
    ours = zarr.open_group(str(tmp_path / "ours.zspy"), mode="r", zarr_format=2)
    assert dict(ours.attrs) == dict(theirs.attrs)
    t, o = theirs["Experiments/t"], ours["Experiments/scan"]
    assert set(t.group_keys()) <= set(o.group_keys())
    for i in range(4):
        assert dict(o[f"axis-{i}"].attrs) == {**dict(t[f"axis-{i}"].attrs), "name": dict(o[f"axis-{i}"].attrs)["name"]}
    assert dict(o["metadata/Acquisition_instrument/TEM"].attrs) == dict(t["metadata/Acquisition_instrument/TEM"].attrs)
    read = read_scan(tmp_path / "ours.zspy")
    np.testing.assert_array_equal(read.data[:], data)
    assert read.found == read_scan(fixture).found


def test_writers_refuse_what_their_format_cannot_hold(tmp_path):
    counts = np.zeros((3, 2, 8, 8), np.uint16)
    with pytest.raises(ExperimentalInputError, match="holds counts"):
        write_scan(tmp_path / "a.mib", counts - 0.5, ScanCalibrations())
    with pytest.raises(ExperimentalInputError, match="square scan"):
        write_scan(tmp_path / "a_master.h5", counts, ScanCalibrations(step_A=(0.5, 0.5)))
    with pytest.raises(ExperimentalInputError, match="namsa writes no Digital Micrograph files"):
        write_scan(tmp_path / "a.dm4", counts, ScanCalibrations())
    with pytest.raises(ExperimentalInputError, match="EMPAD frame is 128 x 128"):
        write_scan(tmp_path / "a.xml", np.zeros((2, 2, 130, 130)), ScanCalibrations())


def test_mib_counts_beyond_16_bits_are_written_as_u32(tmp_path):
    counts = np.full((2, 3, 8, 8), 70_000, np.uint32)
    counts[0, 0, 4, 4] = 3
    write_scan(tmp_path / "wide.mib", counts, ScanCalibrations())
    np.testing.assert_array_equal(read_scan(tmp_path / "wide.mib").data[:], counts)


def test_a_scan_at_five_times_the_trained_defocus_is_reported_as_such_by_reconstruct(tmp_path):
    """Issue 31's case: a microscope file of a scan defocused by +200 A (the shipped model trained on
    +-40 A) is reconstructed, and reconstruction.json records one defocus finding with the estimate
    beside the training range (the scan step the fit used reaches the input report)."""
    info, _, _ = _reconstruct(defocused_si_scan(), tmp_path / "scan.hspy",
                              CameraSettings(dose_e_per_A2=1e5))
    predict = info["checks"]["predict"]
    assert [w["code"] for w in predict["warnings"]].count("defocus") == 1, predict["warnings"]
    # the dose is the file's as read (checks.before), not re-read on the cropped, rebinned tiles
    assert "dose_e_per_A2" not in predict["measured"] and "dose" not in [w["code"] for w in predict["warnings"]]
    assert predict["measured"]["defocus_A"]["value"] is not None  # the estimate, with its training range beside it
