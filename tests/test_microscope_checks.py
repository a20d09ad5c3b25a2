"""Checks before inference (stage.microscope.checks), against the model's card after it
(models.scan_fit.card_checks) and `Reconstructor.predict`'s warnings: real namsa simulations pass; spot patterns, a disc that disagrees with the semi-angle,
Poisson counts, normalised data, a saturated detector and implausible maps are each named."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from microscope_helpers import disc_scan, simulated_scan, spot_scan
from models.card import ModelCard, validate_card
from models.scan_fit import OutsideTrainingWarning, card_checks, trained_dose_range
from stage.microscope import ExperimentalInputError, RawScan, checks


@pytest.fixture(scope="module")
def sim():
    return simulated_scan()


def _found(meta, semiangle=True):
    sy, sx = meta.scan_shape
    found = {"energy_kv": meta.energy_kv, "dk_inv_A": (meta.pattern_dk_inv_A,) * 2,
             "step_A": (meta.fov_A[2] / sy, meta.fov_A[3] / sx)}
    if semiangle:
        found["semiangle_mrad"] = meta.semiangle_mrad
    return found


def _codes(report):
    return {w["code"] for w in report["warnings"]}


def test_a_simulated_scan_passes_with_measurements(sim):
    data, meta = sim
    cal, report, from_data = checks.check_before_inference(RawScan(data, _found(meta), "sim.hspy"), {})
    assert cal.sources["semiangle_mrad"] == "file metadata"
    radius = report["measured"]["disc_radius_px"]
    assert abs(radius["value"] - radius["expected"]) < radius["tolerance"]
    assert _codes(report) == {"normalised"}  # namsa's patterns carry ~1 each, not counts
    assert from_data.report()["semiangle_mrad"]["value"] == pytest.approx(20.0, rel=0.1)


def test_spot_patterns_are_refused():
    data = spot_scan()
    found = {"energy_kv": 200.0, "semiangle_mrad": 20.0, "dk_inv_A": (0.1736, 0.1736), "step_A": (0.375, 0.375)}
    with pytest.raises(ExperimentalInputError, match="do not look like CBED"):
        checks.check_before_inference(RawScan(data, found, "spots.hspy"), {})


def test_a_disc_that_disagrees_with_the_semiangle_is_refused(sim):
    data, meta = sim
    with pytest.raises(ExperimentalInputError) as info:
        checks.check_before_inference(RawScan(data, _found(meta), "sim.hspy"), {"semiangle_mrad": 40.0})
    text = str(info.value)
    assert "radius of 4.2" in text and "gives 9.0" in text, text  # measured and expected radii
    assert "--semiangle-mrad" in text and "--dk-inv-a" in text and "suggest 18." in text


def test_a_missing_semiangle_is_taken_from_the_disc(sim):
    data, meta = sim
    cal, report, _ = checks.check_before_inference(RawScan(data, _found(meta, semiangle=False), "sim.hspy"), {})
    assert cal.sources["semiangle_mrad"] == checks.FIT_SOURCE
    assert cal.semiangle_mrad == pytest.approx(meta.semiangle_mrad, rel=0.1)
    # a flag still wins over the fit
    bare = RawScan(data, _found(meta, semiangle=False), "s")
    cal, _, _ = checks.check_before_inference(bare, {"semiangle_mrad": 20.0})
    assert cal.sources["semiangle_mrad"] == "command line"


def test_poisson_counts_give_the_dose(sim):
    data, meta = sim
    electrons = 5000.0
    counts = np.random.default_rng(0).poisson(data.astype(np.float64) * electrons).astype(np.uint16)
    found = _found(meta)
    _, report, _ = checks.check_before_inference(RawScan(counts, found, "counts.hspy"), {})
    dose = report["measured"]["dose_e_per_A2"]
    kept = float(data.sum(axis=(2, 3)).mean())  # the share of the probe inside the detector
    assert dose["value"] == pytest.approx(electrons * kept / (found["step_A"][0] * found["step_A"][1]), rel=0.02)
    assert "saturation" not in _codes(report) and "normalised" not in _codes(report)


def test_a_saturated_detector_is_named(sim):
    data, meta = sim
    counts = np.random.default_rng(0).poisson(data.astype(np.float64) * 5000.0)
    clipped = np.minimum(counts, 40).astype(np.uint16)  # a detector that counts at most 40 per pixel
    _, report, _ = checks.check_before_inference(RawScan(clipped, _found(meta), "clipped.hspy"), {})
    assert "saturation" in _codes(report)
    assert report["measured"]["pixels_at_scan_max"]["value"] > checks.SATURATION_FRACTION


def test_data_in_arbitrary_units_are_named(sim):
    data, meta = sim
    _, report, _ = checks.check_before_inference(RawScan(data * 37.5, _found(meta), "au.hspy"), {})
    assert "arbitrary-units" in _codes(report)


def _card(dose_augmentation: dict | None = None) -> ModelCard:
    """The shipped card, typed, with these training statistics and dose augmentation (None: trained
    noise-free, as its expects_input has no fixed dose)."""
    from models import pretrained_card

    raw = pretrained_card("study-scan").to_json()
    raw["normalizer"]["targets"] = {"potential": [831.0, 1530.0], "density": [74.6, 283.0]}
    raw["trained_on"]["dose_augmentation"] = dose_augmentation
    return validate_card(raw, "the test card")


CARD = _card()


def test_implausible_maps_are_flagged():
    rng = np.random.default_rng(1)
    plausible = {"potential": 800 + 500 * rng.random((32, 32)), "density": 70 + 50 * rng.random((32, 32))}
    assert card_checks.check_after_inference(plausible, CARD)["warnings"] == []
    wild = {"potential": -plausible["potential"], "density": 100 * plausible["density"]}
    report = card_checks.check_after_inference(wild, CARD, {"measured": {"dose_e_per_A2": {"value": 1e3}}})
    assert _codes(report) == {"potential-negative", "density-too-large", "dose"}
    assert "trained noise-free" in next(w["message"] for w in report["warnings"] if w["code"] == "dose")
    # a dose past the noise-free threshold (here the absurd one a quantum of float data implies) is
    # measured but warns of nothing
    quiet = card_checks.check_after_inference(wild, CARD, {"measured": {"dose_e_per_A2": {"value": 5e45}}})
    assert "dose" not in _codes(quiet)


def test_a_dose_inside_the_trained_range_is_quiet_and_one_below_it_warns():
    card = _card({"enabled": True, "dose_range_e_per_A2": [100.0, 1e6]})
    assert trained_dose_range(card) == (100.0, 1e6) and trained_dose_range(CARD) is None
    maps = {"potential": np.full((4, 4), 900.0), "density": np.full((4, 4), 80.0)}
    inside = card_checks.check_after_inference(maps, card, {"measured": {"dose_e_per_A2": {"value": 1e3}}})
    assert inside["warnings"] == []
    below = card_checks.check_after_inference(maps, card, {"measured": {"dose_e_per_A2": {"value": 20.0}}})
    assert "below the 100-1e+06 e/Angstrom^2 the model was trained at" in below["warnings"][0]["message"]


def test_predict_warns_outside_what_the_model_learned(sim):
    from models import load_reconstructor

    data, _ = sim
    rec = load_reconstructor("pretrained:study-scan", device="cpu")
    stack = np.tile(data, (4, 4, 1, 1)).reshape(1024, 32, 32)  # the model's 32 x 32 scan
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutsideTrainingWarning)
        rec.predict(stack)  # noise-free, normalised, the card's disc: nothing to say
    assert rec.last_report["warnings"] == []
    # ~5 electrons a pattern: a dose below the 1e2-1e6 e/A^2 the shipped model was trained at
    noisy = np.random.default_rng(2).poisson(stack.astype(np.float64) * 5.0) / 5.0
    with pytest.warns(OutsideTrainingWarning, match="below the 100-1e\\+06 e/Angstrom\\^2") as caught:
        rec.predict(noisy.astype(np.float32))
    assert caught[0].filename == __file__  # attributed to the caller's line
    flat = np.full((1024, 32, 32), 1.0 / 1024, np.float32)  # one level only: no dose to read
    assert "dose_e_per_A2" not in card_checks.input_report(flat, rec.card)["measured"]
    assert rec.last_report["measured"]["dose_e_per_A2"]["value"] > 0
    with warnings.catch_warnings():  # said once per reconstructor; the record still has it
        warnings.simplefilter("error", OutsideTrainingWarning)
        rec.predict(noisy.astype(np.float32))
    assert "dose" in {w["code"] for w in rec.last_report["warnings"]}
    with pytest.warns(OutsideTrainingWarning, match="learned patterns carrying about 1"):
        rec.predict(stack * 1000.0)
    with pytest.warns(OutsideTrainingWarning, match="disc-radius"):
        rec.predict(disc_scan((32, 32), 32, radius=9.0).reshape(1024, 32, 32))


def load_card_of(name: str) -> ModelCard:
    from models import load_reconstructor

    return load_reconstructor(name, device="cpu").card


def test_reconstruct_records_checks_and_calibration_from_the_data(tmp_path, capsys):
    """`namsa reconstruct` on counted CBED without a semi-angle in its metadata: the semi-angle is
    fitted from the disc, the dose is measured and warned about, and reconstruction.json holds both."""
    import json

    from microscope_helpers import write_hspy
    from workflow.cli import main

    pytest.importorskip("rsciio")
    counts = np.random.default_rng(3).poisson(disc_scan((32, 32), 32, radius=4.6) * 5000.0).astype(np.uint16)
    path = write_hspy(tmp_path / "counts.hspy", counts, semiangle_mrad=None)
    assert main(["reconstruct", str(path), "--model", "pretrained:study-scan", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    dose = info["checks"]["before"]["measured"]["dose_e_per_A2"]["value"]
    low = trained_dose_range(load_card_of("pretrained:study-scan"))[0]
    # a dose below what the model was trained at is said on stderr; one inside it is only recorded
    assert ("namsa: warning: the data carry a dose of about" in err) == (dose < low), (dose, err)
    assert info["calibrations"]["semiangle_mrad"]["source"] == checks.FIT_SOURCE
    assert info["calibrations"]["semiangle_mrad"]["value"] == pytest.approx(20.0, rel=0.1)
    assert info["checks"]["before"]["measured"]["dose_e_per_A2"]["value"] > 0
    assert {"before", "predict", "after"} <= set(info["checks"])
    cal = info["calibration_from_data"]
    assert cal["semiangle_mrad"]["uncertainty"] > 0 and cal["descan_residual_rms_px"]["unit"] == "px"


def test_reconstruct_accepts_a_fitted_semiangle_within_its_precision(sim, tmp_path):
    """A namsa simulation at 20 mrad whose file lacks the semi-angle: the disc gives 6% less, which
    the model's 1% physics check would refuse for a stated value, but not for a measured one."""
    import json

    from microscope_helpers import write_hspy
    from workflow.cli import main

    pytest.importorskip("rsciio")
    data, meta = sim
    scan = np.tile(data, (4, 4, 1, 1))  # the model's 32 x 32 scan (the stated step is the model's)
    path = write_hspy(tmp_path / "sim.hspy", scan, dk_inv_A=meta.pattern_dk_inv_A, semiangle_mrad=None)
    assert main(["reconstruct", str(path), "--model", "pretrained:study-scan", "--out", str(tmp_path / "out")]) == 0
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    fitted = info["calibrations"]["semiangle_mrad"]
    assert fitted["source"] == checks.FIT_SOURCE and abs(fitted["value"] - 20.0) > 0.2, fitted
