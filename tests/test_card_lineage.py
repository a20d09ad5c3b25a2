"""A model card's chain of runs (``training.lineage``): written by every export, continued by each
fine-tune, carried by `namsa publish`, shown by the report, and checked when a card is loaded."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture finished_run builds on)
from _publish_fixture import copy_run, finished_run  # noqa: F401  (session fixture)
from _train_helpers import one_thread  # noqa: F401  (fixture)
from evaluation.report import render
from models.card import CARD_FILE, ModelDirError, read_card_file, validate_card
from models.card_training import today_utc
from models.checkpoint import file_digest
from models.reconstructor import load_reconstructor
from models.training.init_weights import initial_lineage
from test_fine_tune import _train, source_model  # noqa: F401  (source_model: the module's 6-step run)
from workflow.pretrained import PRETRAINED_ROOT, publish

pytestmark = pytest.mark.usefixtures("one_thread")


def _card(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / CARD_FILE).read_text())


def _fine_tune(source: Path, data_dir: Path, out: Path) -> Path:
    """A real 2-step fine-tune of ``source`` on ``data_dir``; its exported model folder."""
    return Path(_train(out, data_dir, init_from=str(source), max_steps=2, checkpoint_every=2, eval_every=2,
                       lr0=1e-4).model_dir)


@pytest.fixture(scope="module")
def tuned(source_model, tiny_data_dir, tmp_path_factory) -> Path:  # noqa: F811
    return _fine_tune(source_model, tiny_data_dir, tmp_path_factory.mktemp("tuned") / "run")


def _check_last_link(model_dir: Path, steps: int, train_samples: int) -> dict[str, Any]:
    """The card's last link is this run: the weights beside it, its steps and samples, dated today."""
    card = _card(model_dir)
    last = card["training"]["lineage"][-1]
    assert last["weights_xxh3_128"] == file_digest(model_dir / "model.safetensors")
    assert last["weights_xxh3_128"] == card["files"]["model.safetensors"]["xxh3_128"]
    assert (last["steps"], last["train_samples"]) == (steps, train_samples) == (card["training"]["steps"],
                                                                                 card["data"]["train_samples"])
    assert last["samples_seen"] == card["training"]["samples_seen"] and last["device"] == "cpu"
    assert last["date"] <= today_utc() and last.get("name") is None
    return card


def test_a_run_from_scratch_has_one_link_and_a_fine_tune_adds_its_own(source_model, tuned):  # noqa: F811
    source = _check_last_link(source_model, 6, _card(source_model)["data"]["train_samples"])
    assert len(source["training"]["lineage"]) == 1
    card = _check_last_link(tuned, 2, source["data"]["train_samples"])
    assert card["training"]["lineage"][0] == source["training"]["lineage"][0]
    assert len(card["training"]["lineage"]) == 2
    origin = card["training"]["initialized_from"]
    assert origin["weights_xxh3_128"] == card["training"]["lineage"][0]["weights_xxh3_128"]


def test_a_fine_tunes_card_joins_its_initial_models_training_statistics(source_model, tuned):  # noqa: F811
    """The trainer's export of a fine-tune records the union of its initial model's card's ranges and its own
    training split's (`models.card_statistics.union_statistics`): here the same data twice."""
    source, card = _card(source_model)["training_statistics"], _card(tuned)["training_statistics"]
    assert "note" not in source and card["samples"] == 2 * source["samples"]
    assert card["note"].startswith("the union of the training statistics of the initial model")
    for name, r in card["ranges"].items():
        assert (r["low"], r["high"], r["samples"]) == (source["ranges"][name]["low"], source["ranges"][name]["high"],
                                                       2 * source["ranges"][name]["samples"])


def test_publish_carries_the_chain_and_a_fine_tune_of_the_published_model_writes_three(
        finished_run, tuned, tiny_data_dir, tmp_path):  # noqa: F811
    # the fine-tuned model in a finished run's folder (its metrics are the tiny run's: publish reads them as they are)
    run = copy_run(finished_run, tmp_path / "run")
    shutil.rmtree(run / "model")
    shutil.copytree(tuned, run / "model")
    published = publish(run, "chain-test", tmp_path / "pub")
    before, after = _card(tuned)["training"], _card(published)["training"]
    assert after["lineage"] == before["lineage"]
    assert {k: v for k, v in after.items() if k != "initialized_from"} == \
        {k: v for k, v in before.items() if k != "initialized_from"}
    # (publish cuts this machine's paths: the source folder is named by its last part)
    assert after["initialized_from"]["model"] == Path(before["initialized_from"]["model"]).name
    # the fine-tune of the published model: the chain's second link now named as it was published
    again = _fine_tune(published, tiny_data_dir, tmp_path / "again")
    links = _check_last_link(again, 2, _card(tuned)["data"]["train_samples"])["training"]["lineage"]
    assert len(links) == 3
    assert links[:2] == [before["lineage"][0], {**before["lineage"][1], "name": "chain-test"}]
    assert links[0]["date"] <= links[1]["date"] <= links[2]["date"]


def _broken(card: dict[str, Any], how: str) -> dict[str, Any]:
    """``card`` with its chain contradicting itself in one way."""
    card = copy.deepcopy(card)
    links = card["training"]["lineage"]
    if how == "last hash":
        links[-1]["weights_xxh3_128"] = "0" * 32
    elif how == "dates back":
        links[0]["date"], links[-1]["date"] = "2031-01-02", "2031-01-01"
    elif how == "penultimate":
        links[-2]["weights_xxh3_128"] = "f" * 32
    elif how == "last steps":
        links[-1]["steps"] += 1
    elif how == "two links, no origin":
        del card["training"]["initialized_from"]
    elif how == "no calendar date":
        links[-1]["date"] = "2031-02-30"
    return card


@pytest.mark.parametrize("how, message", [
    ("last hash", r"training.lineage ends at weights 0{32} but files.model.safetensors is [0-9a-f]{32}"),
    ("dates back", r"link 2 is dated 2031-01-01, before link 1's 2031-01-02; a chain's dates never go backwards"),
    ("penultimate", r"link before the last is f{32} but training.initialized_from is [0-9a-f]{32}"),
    ("last steps", r"last link has 3 steps but training.steps is 2"),
    ("two links, no origin", r"has 2 links but no training.initialized_from"),
    ("no calendar date", r"'2031-02-30' is no calendar date"),
])
def test_a_card_whose_chain_contradicts_itself_is_refused_in_one_line(tuned, how, message):
    card = _card(tuned)
    assert validate_card(card, "the card").training.lineage is not None
    with pytest.raises(ModelDirError, match=message) as refused:
        validate_card(_broken(card, how), "the card")
    assert "\n" not in str(refused.value)


def test_a_card_without_a_chain_loads_and_a_fine_tune_of_it_starts_one_from_its_facts(tuned):
    card = _card(tuned)
    del card["training"]["lineage"]
    assert validate_card(card, "an older card").training.lineage is None
    flagship = read_card_file(PRETRAINED_ROOT / "study-scan-gpu" / CARD_FILE)
    assert flagship.training.lineage is None
    assert load_reconstructor("pretrained:study-scan-gpu", device="cpu").card.name == "study-scan-gpu"
    (link,) = initial_lineage(flagship)
    assert (link.name, link.train_samples, link.steps, link.device, link.date) == \
        ("study-scan-gpu", flagship.data.train_samples, flagship.training.steps, "NVIDIA H200", None)
    assert link.weights_xxh3_128 == flagship.files["model.safetensors"].xxh3_128


def test_the_report_lists_the_chain_among_the_training_result(finished_run, tuned):  # noqa: F811
    doc = json.loads((finished_run / "eval" / "metrics.json").read_text())
    doc["model_card"] = _card(tuned)
    samples = _card(tuned)["data"]["train_samples"]
    assert f"2 links, 8 steps in all, {2 * samples:,} training samples summed over the links (a sample two links " \
           f"trained on counts twice): unnamed: {samples:,} samples, 6 steps, cpu, " in render(doc)
