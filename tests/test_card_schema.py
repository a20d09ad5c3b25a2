"""The model card's schema (models.card): what it checks asks the owners of the rules, and every field
is typed. The shape of the input a card expects is checked by `Architecture.data_mismatch`, the rule the
pipeline config and the training data check ask; every inner record is typed and bounded (no free
dict), every shipped card reads into them and back unchanged, a checkpoint card's losses come from its
position and `namsa publish` builds its card from records (`models.card_writer.published_card`)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from models.card import CARD_FILE, ExpectsInput, ModelCard, read_card_file, validate_card
from models.card_provenance import CheckSample, EvaluatedData, HeldOutEvaluation, TrainedOn
from models.card_training import ModelConfigRecord, TrainingFacts, TrainingMetrics, position_metrics
from models.card_writer import card_from_state, published_card, write_card
from models.config import TrainConfig
from models.errors import ModelDirError
from namsa.config import SimulationConfig
from stage.config import DataConfig

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


def _untyped(annotation: Any) -> bool:
    """Whether ``annotation`` is, or holds, `typing.Any`."""
    return annotation is Any or any(_untyped(a) for a in get_args(annotation) if not isinstance(a, (str, int, float)))


def _records(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic records ``annotation`` names, nested ones included."""
    own = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    return own + [r for a in get_args(annotation) if not isinstance(a, (str, int, float)) for r in _records(a)]


def untyped_fields(record: type[BaseModel], where: str = "", seen: set | None = None) -> list[str]:
    """Every field of ``record`` and of the records inside it typed `Any` (a free dict), and every
    record that takes fields it does not declare."""
    seen = set() if seen is None else seen
    if record in seen:
        return []
    seen.add(record)
    found = [f"{where or record.__name__} (takes undeclared fields)"] if record.model_config.get("extra") == "allow" else []
    for name, field in record.model_fields.items():
        path = f"{where}.{field.alias or name}".lstrip(".")
        found += [f"{path}: {field.annotation}"] if _untyped(field.annotation) else []
        for inner in _records(field.annotation):
            found += untyped_fields(inner, path, seen)
    return found


def test_no_field_of_the_card_is_a_free_dict():
    assert untyped_fields(ModelCard) == []


@pytest.mark.parametrize("path", SHIPPED_CARDS, ids=lambda p: p.parent.name)
def test_every_shipped_card_round_trips_through_its_typed_records(path, tmp_path):
    raw = json.loads(path.read_text())
    card = read_card_file(path)
    assert card.to_json() == raw   # nothing added, dropped or retyped
    assert isinstance(card.training, TrainingFacts) and isinstance(card.metrics, TrainingMetrics)
    assert isinstance(card.trained_on, TrainedOn) and isinstance(card.held_out_evaluation, HeldOutEvaluation)
    assert isinstance(card.trained_on.data, EvaluatedData) and all(isinstance(c, CheckSample) for c in card.check_samples)
    assert isinstance(card.simulation_config, SimulationConfig) and isinstance(card.data_config, DataConfig)
    assert isinstance(card.train_config, TrainConfig) and isinstance(card.model_config_, ModelConfigRecord)
    again = read_card_file(write_card(tmp_path, card))
    assert again == card and again.to_json() == raw


def test_a_checkpoint_cards_losses_come_from_its_position_and_json_holds_no_nan():
    shipped = read_card_file(SCAN_CARD).to_json()
    state = {k: shipped[k] for k in ("model_config", "architecture", "targets", "normalizer", "train_config")}
    state.update(format_version=1, files=shipped["files"])
    position = {"step": 7, "best_dev_loss": 0.25, "best_step": 5, "last_dev_loss": math.nan, "last_train_loss": 0.5}
    card = card_from_state(state, "a test state", source="checkpoint", metrics=position_metrics(position))
    assert card.metrics == TrainingMetrics(best_dev_loss=0.25, best_step=5, final_dev_loss=None, final_train_loss=0.5)
    json.dumps(card.to_json(), allow_nan=False)
    with pytest.raises(ModelDirError, match="metrics.best_step"):
        card_from_state(state, "a test state", metrics=position_metrics({"best_step": "five"}))


def test_publish_builds_the_card_from_records_without_this_machines_paths():
    raw = json.loads(SCAN_CARD.read_text())
    trained = validate_card({**raw, "metrics_csv": "/home/me/run/metrics.csv",
                             "data": {**raw["data"], "dirs": ["/home/me/run/data/store-000"]}}, "a trained card")
    sim, data = trained.simulation_config, trained.data_config
    evaluated = trained.trained_on.data.model_copy(update={"stores": ["/scratch/me/run/data/store-000"]})
    card = published_card(trained, "the test card", name="renamed", simulation=sim, data=data,
                          trained_on=TrainedOn.of("study", sim, data, evaluated),
                          held_out_evaluation=trained.held_out_evaluation, check_samples=trained.check_samples)
    assert card.name == "renamed" and card.metrics_csv is None and card.data.dirs is None
    assert card.trained_on.data.stores == ["store-000"] and card.expects_input == ExpectsInput.of(sim)
    assert card.trained_on.variations == sim.variations and card.trained_on.split_by == data.split_by
    assert card.architecture == trained.architecture and card.files == trained.files
