"""The thickness estimate from a scan's PACBED (models/scan_fit/thickness.py) against the shipped
reference (models/pretrained/study-scan-gpu/thickness_reference.safetensors): a rebuild agrees with the
stored file; NiO [011] and cuprite Cu2O (neither in the reference set; cuprite a structure type the shipped
model never saw) simulated with the card's physics are estimated within the stated range, 300 A is flagged
and 60 A is not; bad input gets a reason, not a number; a damaged or linked reference file is refused."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from models.card import CARD_FILE, read_card_file
from models.errors import ModelDirError
from models.scan_fit.card_checks import input_report
from models.scan_fit.thickness import (REFERENCE_FILE, WARNING_CODE, check_thickness, estimate_thickness,
                                       find_reference, load_reference)
from models.scan_fit.trained_ranges import trained_ranges
from models.scan_fit.thickness_reference import DEPTHS_A, material_profiles
from namsa import simulate_sample
from stage.microscope.check_report import new_report

MODEL = Path(__file__).resolve().parent.parent / "models" / "pretrained" / "study-scan-gpu"
CUPRITE = "A2B_cP6_224_b_a:Cu,O:1.0"


@functools.lru_cache(maxsize=1)
def _card():
    return read_card_file(MODEL / CARD_FILE)


@functools.lru_cache(maxsize=8)
def _scan(material: str, axis: tuple[int, int, int], thickness_A: float) -> tuple[np.ndarray, float, float]:
    """(cbed (S, P, P), detector pixel mrad, realised thickness A) of a frozen-phonon simulation with the
    card's physics: a 12 x 12 scan over the middle 0.35 of the supercell (0.35-0.45 A steps, at least one
    unit cell of these crystals: a PACBED needs one period finely sampled)."""
    cfg = _card().expects_input.simulation_config()
    variations = cfg.variations.model_copy(update={"thickness_range_A": None, "frozen_phonon": True,
                                                   "frozen_phonon_fraction": None})
    cfg = cfg.model_copy(update={"thickness_A": thickness_A, "variations": variations, "scan_shape": (12, 12),
                                 "scan_fov_fraction": 0.35})
    sample = simulate_sample(material, axis, cfg)
    return sample.cbed, sample.meta.angular_sampling_mrad, sample.meta.thickness_A


def test_the_stored_reference_agrees_with_a_rebuild() -> None:
    reference = load_reference(MODEL / REFERENCE_FILE)
    assert not reference.mismatch(_card().expects_input)
    assert (MODEL / REFERENCE_FILE).stat().st_size < 1 << 20
    # the set's cheapest material, every depth (a shallower supercell draws other phonon displacements)
    rebuilt = material_profiles("C-diamond", _card().expects_input.simulation_config(), (0, 1, 1), DEPTHS_A)
    stored = reference.profiles[reference.names.index("C-diamond|011")]
    np.testing.assert_allclose(rebuilt, stored, atol=2e-3)
    assert np.all(np.diff(reference.depths_A) > 0) and reference.depths_A[-1] >= 2 * trained_ranges(
        _card()).thickness_A.high


def test_thin_nio_is_estimated_within_its_range_and_not_flagged() -> None:
    cbed, mrad, thickness = _scan("NiO-rocksalt", (0, 1, 1), 60.0)
    found = estimate_thickness(cbed, load_reference(MODEL / REFERENCE_FILE), mrad)
    assert found.low_A <= thickness <= found.high_A, found
    report = new_report()
    check_thickness(report, cbed, _card(), mrad)
    assert not [w for w in report["warnings"] if w["code"] == WARNING_CODE]
    measured = report["measured"]["thickness_A"]
    assert measured["unit"] == "Angstrom" and measured["training_range"] == [10.0, 150.0]


def test_thick_cuprite_is_flagged_and_the_input_report_leaves_thickness_to_reconstruct() -> None:
    cbed, mrad, thickness = _scan(CUPRITE, (0, 0, 1), 300.0)
    # predict's input checks also score simulations without frozen phonons (namsa evaluate), where the
    # diffuse tail the estimate reads is missing: the thickness is namsa reconstruct's, on a file's scan
    assert "thickness_A" not in input_report(cbed, _card())["measured"]
    report = new_report()
    check_thickness(report, cbed, _card())   # no calibration: the pixel comes from the disc radius
    measured = report["measured"]["thickness_A"]
    assert measured["range"][0] <= thickness <= measured["range"][1] or measured["at_least"], measured
    codes = [w["code"] for w in report["warnings"]]
    assert WARNING_CODE in codes, report["warnings"]
    message = next(w["message"] for w in report["warnings"] if w["code"] == WARNING_CODE)
    assert "\n" not in message and "10-150 A" in message and "not trustworthy" in message


@pytest.mark.slow
@pytest.mark.parametrize("material,axis,thickness,flagged", [
    ("NiO-rocksalt", (0, 1, 1), 150.0, False), (CUPRITE, (0, 1, 1), 300.0, True),
    (CUPRITE, (0, 0, 1), 60.0, False), (CUPRITE, (0, 0, 1), 150.0, False)])
def test_nio_and_cuprite_at_each_thickness(material: str, axis: tuple[int, int, int], thickness: float,
                                           flagged: bool) -> None:
    cbed, mrad, realised = _scan(material, axis, thickness)
    report = new_report()
    found = check_thickness(report, cbed, _card(), mrad)
    assert found.low_A <= realised <= found.high_A or (found.at_least and realised >= found.low_A), found
    assert (WARNING_CODE in [w["code"] for w in report["warnings"]]) == flagged, (found, report["warnings"])


def test_bad_input_gets_a_reason_not_a_number() -> None:
    reference = load_reference(MODEL / REFERENCE_FILE)
    zeros = np.zeros((4, 32, 32), np.float32)
    assert "no intensity" in estimate_thickness(zeros, reference, 4.4)
    spot = np.zeros((32, 32))
    spot[16, 16] = 1.0   # a parallel beam's single spot: no disc to read
    assert "no bright-field disc" in estimate_thickness(spot, reference, 4.4)
    assert "negative" in estimate_thickness(-np.ones((32, 32)), reference, 4.4)
    cbed, mrad, _ = _scan("NiO-rocksalt", (0, 1, 1), 60.0)
    assert "short of" in estimate_thickness(cbed[:, 8:-8, 8:-8], reference, mrad)   # a detector too small
    report = new_report()
    assert check_thickness(report, zeros, _card()) is None
    note = report["measured"]["thickness_A"]["note"]
    assert report["measured"]["thickness_A"]["value"] is None and note.startswith("not estimated") and "\n" not in note


def test_a_damaged_or_linked_reference_is_refused(tmp_path: Path) -> None:
    damaged = tmp_path / REFERENCE_FILE
    damaged.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(ModelDirError, match="damaged or not a thickness reference"):
        load_reference(damaged)
    linked = tmp_path / "linked" / REFERENCE_FILE
    linked.parent.mkdir()
    linked.symlink_to(MODEL / REFERENCE_FILE)
    with pytest.raises(ModelDirError, match="symbolic link"):
        load_reference(linked)


def test_a_card_of_other_physics_finds_no_reference() -> None:
    expects = _card().expects_input.model_copy(update={"energy_kv": 300.0})
    other = _card().model_copy(update={"expects_input": expects})
    reason = find_reference(other)
    assert isinstance(reason, str) and "energy_kv" in reason and "build_thickness_reference" in reason


@functools.lru_cache(maxsize=2)
def _own(material: str, axis: tuple[int, int, int]):
    from models.scan_fit.thickness_reference import KnownSpecimen

    specimen = KnownSpecimen.checked(material, axis)
    return specimen, specimen.reference(_card().expects_input.simulation_config())


@pytest.mark.parametrize("thickness,flagged", [(150.0, False), (300.0, True)])
def test_nio_named_is_measured_against_its_own_series(thickness: float, flagged: bool) -> None:
    """The set's estimate reads 300 A NiO [011] as ~180 A (docs: a thin heavy and a thick light crystal look
    alike); named, its own series reads it within `OWN_MARGIN` and flags it, and leaves 150 A unflagged."""
    from models.scan_fit.thickness import OWN_MARGIN

    cbed, mrad, realised = _scan("NiO-rocksalt", (0, 1, 1), thickness)
    specimen, own = _own("NiO-rocksalt", (0, 1, 1))
    report = new_report()
    found = check_thickness(report, cbed, _card(), mrad, specimen=specimen, reference=own)
    assert abs(found.value_A - realised) <= OWN_MARGIN * realised, (found, realised)
    set_estimate = estimate_thickness(cbed, load_reference(MODEL / REFERENCE_FILE), mrad)
    assert abs(found.value_A - realised) <= abs(set_estimate.value_A - realised) + 10.0
    codes = {w["code"]: w["message"] for w in report["warnings"]}
    assert (WARNING_CODE in codes) == flagged and "specimen-mismatch" not in codes, report["warnings"]
    assert report["measured"]["thickness_A"]["method"] == "PACBED matched to a simulated thickness series of NiO-rocksalt [011]"
    if flagged:
        assert "simulated thickness series of NiO-rocksalt [011]" in codes[WARNING_CODE]


def test_a_specimen_named_wrongly_is_said_and_the_set_estimates_instead() -> None:
    cbed, mrad, _ = _scan("NiO-rocksalt", (0, 1, 1), 150.0)
    specimen, own = _own("C-diamond", (0, 1, 1))
    report = new_report()
    check_thickness(report, cbed, _card(), mrad, specimen=specimen, reference=own)
    codes = {w["code"]: w["message"] for w in report["warnings"]}
    assert "C-diamond [011]" in codes["specimen-mismatch"] and "--specimen" in codes["specimen-mismatch"]
    assert report["measured"]["thickness_A"]["method"].startswith("PACBED's diffuse scattering")


def test_a_specimen_that_cannot_be_read_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    from namsa.errors import UserError
    from models.scan_fit.thickness_reference import KnownSpecimen
    from workflow.cli import main

    with pytest.raises(UserError, match="--specimen NoSuchThing"):
        KnownSpecimen.checked("NoSuchThing", (0, 0, 1))
    with pytest.raises(UserError, match="not all 0"):
        KnownSpecimen.checked("NiO-rocksalt", (0, 0, 0))
    assert main(["reconstruct", "missing.hspy", "--model", "pretrained:study-scan", "--out", "o",
                 "--specimen", "NiO-rocksalt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--specimen and --zone-axis go together" in err


def test_a_specimen_that_cannot_be_simulated_keeps_the_estimate_and_says_why(tmp_path: Path) -> None:
    """The series is simulated after the whole scan's inference: a CIF gone by then (or any structure the
    simulator refuses) gives a finding and the set's estimate, not a crash that would lose the maps."""
    from models.scan_fit.thickness_reference import KnownSpecimen

    cbed, mrad, _ = _scan("NiO-rocksalt", (0, 1, 1), 150.0)
    report = new_report()
    found = check_thickness(report, cbed, _card(), mrad, specimen=KnownSpecimen(str(tmp_path / "gone.cif"), (0, 0, 1)))
    codes = {w["code"]: w["message"] for w in report["warnings"]}
    assert found is not None and "could not be simulated" in codes["specimen-mismatch"]
    assert report["measured"]["thickness_A"]["method"].startswith("PACBED's diffuse scattering")


def test_the_cli_prints_the_named_specimens_thickness(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`namsa reconstruct --specimen --zone-axis` on a NiO [011] file (150 A, frozen phonons, the card's
    physics): the thickness inside the training range warns of nothing, so it is printed as a measurement."""
    import json

    from stage.microscope import ScanCalibrations, write_scan
    from workflow.cli import main

    cfg = _card().expects_input.simulation_config()
    variations = cfg.variations.model_copy(update={"thickness_range_A": None, "frozen_phonon": True,
                                                   "frozen_phonon_fraction": None})
    sample = simulate_sample("NiO-rocksalt", (0, 1, 1), cfg.model_copy(update={"thickness_A": 150.0,
                                                                               "variations": variations}))
    sy, sx = sample.meta.scan_shape
    step = (sample.meta.fov_A[2] / sy, sample.meta.fov_A[3] / sx)
    path = tmp_path / "nio.hspy"
    write_scan(path, sample.cbed.reshape(sy, sx, *sample.cbed.shape[-2:]),
               ScanCalibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=sample.meta.pattern_dk_inv_A, step_A=step))
    out = tmp_path / "out"
    assert main(["reconstruct", str(path), "--model", "pretrained:study-scan-camera", "--out", str(out),
                 "--single-pass", "--specimen", "NiO-rocksalt", "--zone-axis", "0,1,1"]) == 0
    printed = capsys.readouterr().out
    line = next(l for l in printed.splitlines() if "specimen thickness:" in l)
    assert "simulated thickness series of NiO-rocksalt [011]" in line, printed
    measured = json.loads((out / "reconstruction.json").read_text())["checks"]["after"]["measured"]["thickness_A"]
    assert abs(measured["value"] - sample.meta.thickness_A) <= 0.2 * sample.meta.thickness_A, measured
