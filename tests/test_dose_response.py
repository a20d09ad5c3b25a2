"""The card's error-vs-dose curve (models.card_dose) and the low-dose warning that reads it
(models.scan_fit.card_checks, code "dose"): the record is checked when a card is read, the warning
names the dose, the training range and the error the card measured there, and says "unusable" exactly
where the card's own figures make the rule say so."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from models.card import CARD_FILE, validate_card
from models.card_dose import DoseResponse
from models.errors import ModelDirError
from models.scan_fit.card_checks import check_after_inference

FLAGSHIP = Path(__file__).resolve().parents[1] / "models" / "pretrained" / "study-scan-gpu" / CARD_FILE
RAW = json.loads(FLAGSHIP.read_text())


def _stat(mean: float, spread: float = 0.02) -> dict:
    return {"mean": mean, "low": mean - spread, "high": mean + spread, "median": mean}


def _point(dose: float, network: float, mean_image: float = 0.7) -> dict:
    return {"dose_e_per_A2": dose, "potential": {"network": _stat(network), "mean_image": _stat(mean_image),
                                                 "icom": _stat(network + 0.2)}}


def _record(*points: dict, constant: float = 0.8) -> dict:
    return {"view": "field", "metric": "rel_l2", "split": "dev", "n_samples": 32, "n_materials": 32,
            "mean_image_samples": 32, "symmetry_average": True, "ci_level": 0.95, "command": "a test",
            "measured": "2026-12-01", "constant_map": {"potential": _stat(constant)}, "points": list(points)}


def _card(record: dict | None):
    raw = copy.deepcopy(RAW)
    raw.pop("dose_response", None)
    if record is not None:
        raw["dose_response"] = record
    return validate_card(raw, "the test card")


def _dose_warning(card, dose: float) -> str:
    report = check_after_inference({}, card, {"measured": {"dose_e_per_A2": {"value": dose}}})
    found = [w["message"] for w in report["warnings"] if w["code"] == "dose"]
    assert len(found) == 1, report["warnings"]
    return found[0]


@pytest.mark.parametrize("change, said", [
    (lambda r: r["points"].reverse(), "doses must ascend: 10 e/Angstrom^2 follows 100"),
    (lambda r: r["points"].append(_point(100.0, 0.3)), "doses must ascend: 100 e/Angstrom^2 follows 100"),
    (lambda r: r["points"][0]["potential"]["network"].update(low=-0.1), "greater than or equal to 0"),
    (lambda r: r["points"][0]["potential"]["mean_image"].update(mean=math.nan), "finite number"),
    (lambda r: r["points"][0].update(dose_e_per_A2=-10.0), "greater than 0"),
    (lambda r: r["points"][0]["potential"]["network"].update(low=0.9, high=0.5), "low end above its high end"),
    (lambda r: r.pop("split"), "missing field dose_response.split"),
    (lambda r: r.pop("constant_map"), "missing field dose_response.constant_map"),
])
def test_a_bad_curve_is_refused_on_load_in_one_line(change, said):
    record = _record(_point(10.0, 0.8), _point(100.0, 0.3))
    assert _card(record).dose_response.doses == [10.0, 100.0]   # the unchanged record is a card's
    change(record)
    with pytest.raises(ModelDirError) as refused:
        _card(record)
    message = str(refused.value)
    assert said in message and "dose_response" in message and "\n" not in message


def test_the_curve_interpolates_in_log_dose_and_holds_its_ends():
    curve = DoseResponse.model_validate(_record(_point(10.0, 0.8), _point(1000.0, 0.2)))
    middle = curve.at(100.0)   # half-way in log dose
    assert middle.network == pytest.approx(0.5) and middle.network_high == pytest.approx(0.52)
    assert "interpolated in log dose between 10 and 1000" in middle.how
    assert curve.at(1.0).network == 0.8 and "lowest dose, 10" in curve.at(1.0).how
    assert curve.at(1e6).network == 0.2 and "measured at" in curve.at(1000.0).how


def test_unusable_is_where_the_networks_interval_reaches_a_map_that_ignores_the_data():
    # network 0.69 +- 0.02 against a mean image of 0.70: not shown better than ignoring the data
    curve = DoseResponse.model_validate(_record(_point(10.0, 0.69), _point(100.0, 0.5), _point(1000.0, 0.2)))
    assert curve.unusable(10.0) and not curve.unusable(100.0) and not curve.unusable(1000.0)
    # a constant map at 0.51 (better than that mean image): 0.5 +- 0.02 is not shown better than it either
    stricter = DoseResponse.model_validate(_record(_point(10.0, 0.69), _point(100.0, 0.5), _point(1000.0, 0.2),
                                                   constant=0.51))
    assert stricter.unusable(100.0) and not stricter.unusable(1000.0)
    card = _card(curve.model_dump(mode="json"))
    low, high = _dose_warning(card, 10.0), _dose_warning(card, 50.0)
    assert "unusable" in low and "record at a higher dose" in low
    assert "unusable" not in high and "expect that much error" in high
    assert "a dose of about 50 e/Angstrom^2" in high and f"{curve.at(50.0).network:.2f}" in high


def test_the_flagships_warning_at_30_says_unusable_exactly_where_its_card_does():
    card = validate_card(RAW, str(FLAGSHIP))
    curve = card.dose_response
    assert curve is not None, "the flagship's card records its error-vs-dose curve (scripts/card_dose_curve.py)"
    assert curve.split == "dev" and curve.n_samples >= 8
    message = _dose_warning(card, 30.0)
    found = curve.at(30.0)
    ignores_data = min(found.mean_image, curve.constant_map.potential.mean)
    assert ("unusable" in message) == found.unusable == (found.network_high >= ignores_data)
    assert "a dose of about 30 e/Angstrom^2" in message and "100-1e+06 e/Angstrom^2" in message
    assert f"{found.network:.2f}" in message and f"{found.mean_image:.2f}" in message and found.how in message
    assert f"{found.constant:.2f} for a constant map" in message


def test_a_card_without_a_curve_still_warns_of_the_dose():
    message = _dose_warning(_card(None), 30.0)
    assert message == ("the data carry a dose of about 30 e/Angstrom^2, below the 100-1e+06 e/Angstrom^2 the model "
                       "was trained at; expect more error")
