"""The potential as a learned correction of iCoM (model.icom_residual, models.fcdensenet.ICoMResidual),
on the shared tiny real data set (8 x 8 scans of 16 px)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import models
import stage
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401
from models import ModelConfig
from models.fcdensenet import build_model
from namsa.icom import icom_from_sample
from stage.physics_dataset import PhysicsSampleDataset

NAMES = ("com_y", "com_x", "icom")


def _residual_model(norm: stage.Normalizer) -> torch.nn.Module:
    arch = ModelConfig(preset="tiny", targets=["density", "potential"], physics_inputs=list(NAMES),
                       icom_residual=True).architecture()
    model = build_model(arch).eval()
    model.icom_residual.init_gain(norm.physics_stats["icom"][1], norm.targets["potential"][1])
    return model


def test_a_silent_head_returns_the_samples_icom_in_physical_units(tiny_data_dir):
    """With the head's weights zeroed, the de-standardised potential is the sample's own iCoM map
    (computed independently by the evaluation's baseline code) up to the constant the network must
    supply, and the other target is untouched: the network starts from the classical answer."""
    path = stage.find_stores(tiny_data_dir)[0]
    norm = stage.Normalizer.fit([path], "log1p", physics_inputs=NAMES)
    ds = PhysicsSampleDataset([path], "dev", norm, ("density", "potential"), physics_inputs=NAMES)
    model = _residual_model(norm)
    torch.nn.init.zeros_(model.head.weight)
    with torch.no_grad():
        out = model(ds[0]["cbed"][None])[0]
    with stage.open_store(path) as store:
        sample = store[ds.global_indices[0]]
    icom = icom_from_sample(sample, output_shape=out.shape[-2:])
    mean, std = norm.targets["potential"]
    potential = out[1].numpy() * std + mean
    contrast = potential - potential.mean()
    np.testing.assert_allclose(contrast, icom - icom.mean(), atol=1e-3 * np.abs(icom).max())
    assert float(out[0].abs().max()) == 0.0


def test_the_gain_and_the_gate_learn():
    """The gain and the head's gate map get gradients from the potential's loss."""
    torch.manual_seed(0)
    arch = ModelConfig(preset="tiny", physics_inputs=["icom"], icom_residual=True).architecture()
    model = build_model(arch)
    x = torch.randn(2, arch.input_planes, 16, 16)
    model(x).pow(2).mean().backward()
    assert model.icom_residual.gain.grad is not None and float(model.icom_residual.gain.grad.abs()) > 0
    assert float(model.head.weight.grad[-1].abs().sum()) > 0  # the gate's row of the head


def test_icom_residual_without_an_icom_plane_is_refused():
    with pytest.raises(models.ModelConfigError, match="icom_residual needs 'potential'.*'icom' in model.physics_inputs"):
        ModelConfig(preset="tiny", physics_inputs=["com_y"], icom_residual=True).architecture()
    with pytest.raises(models.ModelConfigError, match="icom_residual"):
        ModelConfig(preset="tiny", targets=["density"], physics_inputs=["icom"], icom_residual=True).architecture()


@pytest.mark.usefixtures("one_thread")
def test_training_with_the_icom_residual_end_to_end(tiny_data_dir, tmp_path):
    """A short real run: the card records the residual's channel, the exported weights hold the
    gain, and the loaded reconstructor predicts from a raw stack with its calibration."""
    model_cfg = ModelConfig(preset="tiny", physics_inputs=list(NAMES), icom_residual=True)
    result = models.train(model_cfg, tiny_train_cfg(max_steps=3, eval_every=3, checkpoint_every=3),
                          None, DATA_CFG, [tiny_data_dir], tmp_path / "run")
    card = json.loads((Path(result.model_dir) / "model_card.json").read_text())
    assert card["architecture"]["icom_residual"] == 0
    rec = models.load_reconstructor(result.model_dir, device="cpu")
    norm = rec.normalizer
    start = norm.physics_stats["icom"][1] / norm.targets["potential"][1]
    assert float(rec.model.icom_residual.gain.detach()) == pytest.approx(start, rel=0.2)  # 3 small steps from its start
    with stage.open_store(stage.find_stores(tiny_data_dir)[0]) as store:
        sample = store[0]
    out = rec.predict(sample.cbed, calibration=sample.meta.calibration)
    assert out.shape == (1, 16, 16) and np.isfinite(out).all()
