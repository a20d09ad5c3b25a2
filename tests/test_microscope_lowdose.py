"""Low-dose data run (issue 31, item 2): counted patterns are counts at every dose, patterns without
a count are data (they neither stop a run nor pull the descan fit), every dose a detector can record
gives maps with a dose warning, and a file has one dose, measured on its patterns as read."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import ndimage

from microscope_helpers import simulated_scan, write_hspy
from models.scan_fit import normalise_tile
from namsa.camera import CameraSettings, electrons_per_pattern, record
from stage.microscope import ExperimentalInputError, RawScan, autocal, check_before_inference
from stage.microscope.counts import MIN_DISC_ELECTRONS
from stage.microscope.disc import find_disc

STEP = (0.5, 0.5)


@pytest.fixture(scope="module")
def sim():
    return simulated_scan()  # GaAs [011], 8 x 8 scan, 32 px patterns at the study's physics


def _found(meta, semiangle=True):
    found = {"energy_kv": 200.0, "dk_inv_A": (meta.pattern_dk_inv_A,) * 2, "step_A": STEP}
    return {**found, "semiangle_mrad": 20.0} if semiangle else found


def _codes(report):
    return {w["code"] for w in report["warnings"]}


def test_counts_below_one_electron_per_pattern_are_counts_with_their_dose(sim):
    """3 e/Angstrom^2 at a 0.5 Angstrom step: 0.75 electrons a pattern, most patterns empty. Before,
    a mean total below 1.05 read as "normalised" and gave no dose."""
    data, meta = sim
    counts = record(data, STEP, CameraSettings(dose_e_per_A2=3.0, seed=1))
    assert (counts.sum(axis=(2, 3)) == 0).mean() > 0.3
    _, report, _ = check_before_inference(RawScan(counts, _found(meta), "low.mib"), {})
    measured = report["measured"]
    assert measured["dose_e_per_A2"]["value"] == pytest.approx(counts.sum() / 64 / 0.25)
    assert measured["total_per_pattern"]["patterns_without_counts"] == int((counts.sum(axis=(2, 3)) == 0).sum())
    assert "normalised" not in _codes(report)
    assert "too-few-counts" in _codes(report)          # 48 electrons in the whole scan: no disc to check


def test_too_few_counts_need_the_semiangle_given_and_say_so(sim):
    data, meta = sim
    counts = record(data, STEP, CameraSettings(dose_e_per_A2=0.5, seed=2))
    with pytest.raises(ExperimentalInputError, match=r"lacks 1 calibration\(s\): convergence semi-angle"):
        check_before_inference(RawScan(counts, _found(meta, semiangle=False), "sparse.mib"), {})
    cal, _, calib = check_before_inference(RawScan(counts, _found(meta, semiangle=False), "sparse.mib"),
                                           {"semiangle_mrad": 20.0})
    assert cal.semiangle_mrad == 20.0 and calib.descan_correction((8, 8)) is None


def test_a_scan_without_a_single_count_is_refused_in_one_line():
    with pytest.raises(ExperimentalInputError, match="every pixel of every pattern is 0: the beam was blanked"):
        check_before_inference(RawScan(np.zeros((4, 4, 16, 16), np.uint16), {}, "blank.mib"), {})


def test_empty_patterns_neither_fake_a_descan_nor_hide_a_real_one(sim):
    """A pattern without a count has no beam centre: it is left out of the descan fit (it used to
    count as a beam at pixel (0, 0) and recentre every pattern by a pixel or more)."""
    data, _ = sim
    blanked = data.copy()
    blanked.reshape(64, 32, 32)[np.random.default_rng(0).choice(64, 20, replace=False)] = 0.0
    disc = find_disc(autocal.subsample(data).mean(axis=0))
    cal = autocal.calibrate(blanked, disc, autocal.scan_scalars(blanked, disc))
    assert cal.descan_correction((8, 8)) is None
    assert cal.descan.origin == pytest.approx((16.0, 16.0), abs=0.3)
    shifted = np.stack([[ndimage.shift(blanked[i, j], (0.2 * i, -0.15 * j), order=1) for j in range(8)]
                        for i in range(8)])
    plane = autocal.calibrate(shifted, disc, autocal.scan_scalars(shifted, disc)).descan
    assert plane.slope_y[0] == pytest.approx(0.2, abs=0.05) and plane.slope_x[1] == pytest.approx(-0.15, abs=0.05)


def test_a_low_dose_descan_within_the_fits_noise_is_not_applied(sim):
    data, meta = sim
    counts = record(data, STEP, CameraSettings(dose_e_per_A2=100.0, seed=3))   # 25 electrons a pattern
    assert counts.sum() > MIN_DISC_ELECTRONS
    _, _, calib = check_before_inference(RawScan(counts, _found(meta), "low.mib"), {})
    assert calib.descan_correction((8, 8)) is None


def test_a_tile_without_a_count_is_data():
    tile = np.zeros((16, 8, 8), np.float32)
    same, factor = normalise_tile(tile, "blank tile")
    assert factor == 1.0 and not same.any()


@pytest.mark.parametrize("dose", [0.3, 30.0])
def test_reconstruct_gives_maps_at_any_dose_with_one_dose_figure(tmp_path, capsys, dose):
    """`namsa reconstruct` with pretrained:study-scan on counted Si [001] at 0.3 (70 electrons in the
    scan) and 30 e/Angstrom^2: maps, and the file's one dose (counts as read / step area) in
    reconstruction.json and in the dose warning."""
    import namsa
    from workflow.cli import main

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32)
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    step = sample.meta.fov_A[2] / 32
    counts = record(sample.cbed.reshape(32, 32, 32, 32), (step, step), CameraSettings(dose_e_per_A2=dose, seed=4))
    path = write_hspy(tmp_path / "low.hspy", counts, step_A=step, dk_inv_A=sample.meta.pattern_dk_inv_A)
    assert main(["reconstruct", str(path), "--model", "pretrained:study-scan", "--out", str(tmp_path / "o")]) == 0
    info = json.loads((tmp_path / "o" / "reconstruction.json").read_text())
    assert np.isfinite(np.load(tmp_path / "o" / "potential.npy")).all()
    measured = info["checks"]["before"]["measured"]["dose_e_per_A2"]["value"]
    assert measured == pytest.approx(counts.sum() / 1024 / step ** 2)
    assert measured == pytest.approx(dose, rel=0.25 if dose < 1 else 0.05)
    assert counts.sum() / 1024 == pytest.approx(electrons_per_pattern(dose, (step, step)) * 0.97, rel=0.3)
    err = capsys.readouterr().err
    assert f"the data carry a dose of about {measured:.3g} e/Angstrom^2, below the" in err
