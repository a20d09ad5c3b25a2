"""Issue 42, item 1: every finding of `namsa reconstruct` that bears on trust reaches the terminal as one
`namsa: warning:` line, reconstruction.json's ``findings`` and the figure, the same set, including the
findings of the model's own input checks (`Reconstructor.predict`, one report per block of tiles, merged
once per kind by workflow.reconstruct_findings), which were recorded but never shown before."""
from __future__ import annotations

import json

import pytest

from microscope_helpers import defocused_si_scan
from namsa.camera import CameraSettings, record
from stage.microscope import write_scan
from workflow.cli import main
from workflow.reconstruct_findings import PredictReports, findings


@pytest.fixture(scope="module")
def defocused_scan(tmp_path_factory):
    """A Si [001] scan at C1 = +200 A (the shipped study-scan model trained on +-40 A) as a .hspy file
    that keeps every calibration: an out-of-range file, found out only by the model's input checks."""
    cbed, _, cal = defocused_si_scan()
    path = tmp_path_factory.mktemp("defocused") / "scan.hspy"
    write_scan(path, record(cbed, cal.step_A, CameraSettings(dose_e_per_A2=1e5)), cal)
    return path


def test_the_cli_prints_the_model_checks_findings_as_warnings_and_records_the_same_set(defocused_scan, capsys):
    out = defocused_scan.parent / "out"
    assert main(["reconstruct", str(defocused_scan), "--model", "pretrained:study-scan", "--out", str(out)]) == 0
    printed = [line.removeprefix("namsa: warning: ") for line in capsys.readouterr().err.splitlines()
               if line.startswith("namsa: warning: ")]
    info = json.loads((out / "reconstruction.json").read_text())
    recorded = info["findings"]
    assert printed == [f["message"] for f in recorded]   # one line each, the same set, in the same order
    defocus = next(f for f in recorded if f["code"] == "defocus")
    assert defocus["stage"] == "predict" and "defocus" in defocus["message"]
    assert "its maps are not trustworthy here" in defocus["message"]   # what it means for the maps
    predict = info["checks"]["predict"]
    assert predict["blocks"] >= 1 and [w["code"] for w in predict["warnings"]].count("defocus") == 1
    assert (out / "reconstruction.png").stat().st_size > 0
    # the thickness from the whole scan's PACBED (20 A of Si: inside the training range, no finding)
    thickness = info["checks"]["after"]["measured"]["thickness_A"]
    assert thickness["unit"] == "Angstrom" and thickness["training_range"] == [10.0, 150.0], thickness
    assert "thickness-outside-training" not in [f["code"] for f in recorded]


def test_merged_predict_reports_keep_each_kind_once_with_the_blocks_that_raised_it():
    first = {"warnings": [{"code": "defocus", "message": "defocus 217 A"}], "measured": {"defocus_A": {"value": 217}}}
    second = {"warnings": [{"code": "defocus", "message": "defocus 220 A"},
                           {"code": "scattering", "message": "scatters more"}], "measured": {}}
    reports = PredictReports()
    for report in (first, None, second):
        reports.add(report)
    merged = reports.merged()
    assert merged["blocks"] == 2 and merged["measured"] == first["measured"]
    assert [(w["code"], w["message"], w["blocks"]) for w in merged["warnings"]] == [
        ("defocus", "defocus 217 A", 2), ("scattering", "scatters more", 1)]
    checks = {"after": {"warnings": [{"code": "defocus", "message": "later"}]}, "before": {"warnings": [
        {"code": "dose", "message": "low dose"}]}, "predict": merged}
    assert [(f["code"], f["stage"]) for f in findings(checks)] == [("dose", "before"), ("defocus", "predict"),
                                                                  ("scattering", "predict")]
    assert PredictReports().merged() == {"warnings": [], "measured": {}, "blocks": 0}
