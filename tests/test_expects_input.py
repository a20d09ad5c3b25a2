"""What a model expects of its input has one owner: its card's ``expects_input``, which the trainer's
export writes from the simulation config of the run (`models.training.export.expected_input`) and the
scan fit reads (`models.scan_fit.model_expectation`) without opening a training store."""
from __future__ import annotations

import json
import shutil

import pytest

import models
from _models_fixture import tiny_train_configs, tiny_trained_model  # noqa: F401  (session fixture)
from models.card import CARD_FILE, ExpectsInput, read_card_file
from models.scan_fit import ModelExpectation, model_expectation
from namsa.sampling import ScanSampling, config_sampling
from stage.microscope.errors import ExperimentalInputError


def test_the_export_writes_what_the_run_was_simulated_with(tiny_trained_model, tiny_sim_config):  # noqa: F811
    card = read_card_file(tiny_trained_model.model_dir / CARD_FILE)
    assert card.expects_input == ExpectsInput.of(tiny_sim_config)
    assert card.expects_input.sampling == config_sampling(tiny_sim_config)


def test_the_scan_fit_reads_the_card_and_no_store(tiny_trained_model, tiny_sim_config, tmp_path):  # noqa: F811
    """The card's stores point nowhere: the fit is the card's, so it does not notice."""
    model = tmp_path / "model"
    shutil.copytree(tiny_trained_model.model_dir, model)
    raw = json.loads((model / CARD_FILE).read_text())
    raw["data"]["dirs"] = [str(tmp_path / "no-such-store")]
    (model / CARD_FILE).write_text(json.dumps(raw))
    expect = model_expectation(read_card_file(model / CARD_FILE))
    sampling = config_sampling(tiny_sim_config)
    assert isinstance(expect, ModelExpectation) and isinstance(expect, ScanSampling)
    assert expect.source == "model card expects_input"
    assert ScanSampling(**{k: getattr(expect, k) for k in ScanSampling.__dataclass_fields__}) == sampling
    assert expect.step_range_A[0] < sampling.step_A[0] and expect.dk_range_inv_A[1] > sampling.dk_inv_A[1]


def test_a_card_without_it_is_refused_in_one_line_and_no_store_is_read(tiny_trained_model, tiny_data_dir,  # noqa: F811
                                                                       tmp_path):
    raw = json.loads((tiny_trained_model.model_dir / CARD_FILE).read_text())
    del raw["expects_input"]
    raw["data"]["dirs"] = [str(tiny_data_dir / "store-0")]   # a readable store: still not read
    (tmp_path / CARD_FILE).write_text(json.dumps(raw))
    with pytest.raises(ExperimentalInputError, match="does not say what input it expects") as refused:
        model_expectation(read_card_file(tmp_path / CARD_FILE))
    assert "\n" not in str(refused.value)


def test_stores_of_another_config_give_no_expects_input(tiny_data_dir, tiny_sim_config, tmp_path, capsys):
    """A config that did not simulate the stores (another beam energy): the card claims nothing."""
    model_cfg, train_cfg, dist_cfg, data_cfg = tiny_train_configs()
    other = tiny_sim_config.model_copy(update={"energy_kv": 300.0})
    result = models.train(model_cfg, train_cfg.model_copy(update={"max_steps": 1, "eval_every": 1,
                                                                   "checkpoint_every": 1}),
                          dist_cfg, data_cfg, [tiny_data_dir], tmp_path / "run", simulation=other)
    assert read_card_file(result.model_dir / CARD_FILE).expects_input is None
    assert "records no expects_input" in capsys.readouterr().err
