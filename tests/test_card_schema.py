"""The model card's schema (models.card): what it checks asks the owners of the rules, and every field
is typed. The shape of the input a card expects is checked by `Architecture.data_mismatch`, the rule the
pipeline config and the training data check ask."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.card import CARD_FILE, validate_card
from models.errors import ModelDirError

REPO = Path(__file__).resolve().parents[1]
SHIPPED_CARDS = sorted((REPO / "models" / "pretrained").glob(f"*/{CARD_FILE}"))
SCAN_CARD = REPO / "models" / "pretrained" / "study-scan" / CARD_FILE


@pytest.mark.parametrize("change", [{"scan_shape": [16, 16]}, {"scan_shape": [16, 64]}, {"pattern_px": 24},
                                    {"target_px": 16}])
def test_the_card_refuses_an_expected_input_its_architecture_does_not_take_by_data_mismatch(change):
    raw = json.loads(SCAN_CARD.read_text())
    arch = validate_card(raw, "the shipped card").architecture.architecture()
    expects = {**raw["expects_input"], **change}
    (sy, sx), p, t = expects["scan_shape"], expects["pattern_px"], expects["target_px"]
    problem = arch.data_mismatch(sy * sx, p, t, (sy, sx))
    assert problem is not None, change   # each change is one the rule refuses ...
    with pytest.raises(ModelDirError) as refused:
        validate_card({**raw, "expects_input": expects}, "the changed card")
    said = str(refused.value)
    # ... and the card says the rule's reason, in its own field names
    assert problem.reason.replace("model.", "architecture.").replace("simulation.", "expects_input.") in said
    assert f"expects_input (scan_shape [{sy}, {sx}], pattern_px {p}, target_px {t}) does not fit its architecture" in said


def test_every_shipped_card_fits_the_rule():
    for path in SHIPPED_CARDS:
        card = validate_card(json.loads(path.read_text()), str(path))
        e = card.expects_input
        assert e is not None, path
        sy, sx = e.scan_shape
        assert card.architecture.architecture().data_mismatch(sy * sx, e.pattern_px, e.target_px, (sy, sx)) is None
