"""training.init_from: a run that starts from a trained model's weights and normaliser (fine-tuning)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import models
import stage
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401
from models import ModelConfig
from models.card import CARD_FILE
from models.reconstructor import ReconstructorInputError, load_reconstructor
from models.training import TrainingError

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(out: Path, data_dir: Path, model_cfg: ModelConfig | None = None, data_cfg=DATA_CFG, **train):
    return models.train(model_cfg or ModelConfig(preset="tiny"), tiny_train_cfg(**train), None, data_cfg,
                        [data_dir], out)


@pytest.fixture(scope="module")
def source_model(tiny_data_dir, tmp_path_factory) -> Path:
    """A real 6-step run's exported model: the model the tests fine-tune."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("source") / "run"
    result = _train(out, tiny_data_dir, max_steps=6, eval_every=3, checkpoint_every=3, lr0=5e-3)
    torch.set_num_threads(before)
    return Path(result.model_dir)


def _parameters(model_dir: Path) -> dict[str, torch.Tensor]:
    """The trainable tensors (batch-norm running statistics move in any training step, whatever the lr)."""
    model = load_reconstructor(model_dir, device="cpu").model
    names = {n for n, _ in model.named_parameters()}
    return {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if k in names}


def test_a_fine_tuned_run_starts_from_the_models_weights_and_normaliser(source_model, tiny_data_dir, tmp_path):
    # at lr 1e-12 Adam moves no weight by more than ~1e-11: the export is the source, unless the run
    # started elsewhere (a fresh start with the same seed is checked to differ)
    tuned = _train(tmp_path / "tuned", tiny_data_dir, init_from=str(source_model), lr0=1e-12, max_steps=2,
                   checkpoint_every=2, eval_every=2, seed=5)
    fresh = _train(tmp_path / "fresh", tiny_data_dir, lr0=1e-12, max_steps=2, checkpoint_every=2, eval_every=2,
                   seed=5)
    want = _parameters(source_model)
    got, other = _parameters(Path(tuned.model_dir)), _parameters(Path(fresh.model_dir))
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-9)
    assert any(not torch.allclose(other[n], want[n]) for n in want)
    card = json.loads((Path(tuned.model_dir) / CARD_FILE).read_text())
    source_card = json.loads((source_model / CARD_FILE).read_text())
    assert card["normalizer"] == source_card["normalizer"]
    origin = card["training"]["initialized_from"]
    assert origin["model"] == str(source_model)
    assert origin["weights_xxh3_128"] == source_card["files"]["model.safetensors"]["xxh3_128"]
    assert origin["steps"] == 6
    assert card["train_config"]["init_from"] == str(source_model)


def test_fine_tuning_takes_the_models_normaliser_not_the_datas(source_model, tiny_data_dir, tmp_path):
    """A source whose standardisation differs from what the data would give (its card's potential
    mean moved by 10%): the run keeps the source's, which its weights were fitted to."""
    moved = tmp_path / "moved"
    shutil.copytree(source_model, moved)
    card = json.loads((moved / CARD_FILE).read_text())
    mean, std = card["normalizer"]["targets"]["potential"]
    card["normalizer"]["targets"]["potential"] = [mean * 1.1, std]
    (moved / CARD_FILE).write_text(json.dumps(card))
    tuned = _train(tmp_path / "tuned", tiny_data_dir, init_from=str(moved), max_steps=1, checkpoint_every=1,
                   eval_every=1)
    fitted = stage.Normalizer.fit(stage.find_stores(tiny_data_dir), DATA_CFG.transform).to_dict()
    written = json.loads((Path(tuned.model_dir) / CARD_FILE).read_text())["normalizer"]
    assert written["targets"]["potential"] == pytest.approx([mean * 1.1, std])
    assert fitted["targets"]["potential"][0] == pytest.approx(mean)


def test_another_architecture_is_refused_in_one_line(source_model, tiny_data_dir, tmp_path):
    with pytest.raises(TrainingError, match=r"another model than the config's \(differs in: architecture.growth_rate\)"):
        _train(tmp_path / "run", tiny_data_dir, ModelConfig(preset="tiny", growth_rate=5),
               init_from=str(source_model), max_steps=1)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_other_targets_are_refused(source_model, tiny_data_dir, tmp_path):
    """The same network with another target in its one output channel would load potential weights as
    a density head: refused, as a resume refuses it."""
    with pytest.raises(TrainingError, match=r"differs in: targets"):
        _train(tmp_path / "run", tiny_data_dir, ModelConfig(preset="tiny", targets=["density"]),
               init_from=str(source_model), max_steps=1)


def test_another_input_transform_is_refused(source_model, tiny_data_dir, tmp_path):
    other = stage.DataConfig(num_workers=0, pin_memory=False, transform="sqrt")
    with pytest.raises(TrainingError, match="data.transform is 'sqrt'; set data.transform: log1p"):
        _train(tmp_path / "run", tiny_data_dir, data_cfg=other, init_from=str(source_model), max_steps=1)


def test_a_missing_model_is_named(tiny_data_dir, tmp_path):
    with pytest.raises(ReconstructorInputError, match="does not exist"):
        _train(tmp_path / "run", tiny_data_dir, init_from=str(tmp_path / "nowhere"), max_steps=1)
    with pytest.raises(ReconstructorInputError, match="no pretrained reconstructor 'nope'"):
        _train(tmp_path / "run2", tiny_data_dir, init_from="pretrained:nope", max_steps=1)
