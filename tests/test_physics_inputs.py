"""Physics input channels (stage.physics_inputs, stage.physics_dataset, model.physics_inputs) and the
relative loss weighting (models.losses), on the shared tiny real data set (8 x 8 scans of 16 px)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import models
import stage
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401
from evaluation.baselines import icom_from_sample
from models import ModelConfig
from models.card import validate_card
from models.fcdensenet import build_model
from models.losses import data_loss, huber_loss, relative_huber_loss
from models.reconstructor import Reconstructor
from namsa.icom import fourier_resample
from stage.physics_dataset import PhysicsSampleDataset

NAMES = ("com_y", "com_x", "icom")


def _store(tiny_data_dir: Path) -> Path:
    return stage.find_stores(tiny_data_dir)[0]


def _hand_com(sample) -> tuple[np.ndarray, np.ndarray]:
    """Centre of mass of every pattern written out by hand, (scan_y, scan_x) each, 1/Angstrom."""
    cbed = sample.cbed.astype(np.float64)
    p = cbed.shape[1]
    k = (np.arange(p) - p // 2) * sample.meta.pattern_dk_inv_A
    total = cbed.sum(axis=(1, 2))
    com_y = (cbed.sum(axis=2) * k).sum(axis=1) / total
    com_x = (cbed.sum(axis=1) * k).sum(axis=1) / total
    return com_y.reshape(sample.meta.scan_shape), com_x.reshape(sample.meta.scan_shape)


def test_the_extra_channels_are_the_stacks_com_and_icom(tiny_data_dir):
    """Unnormalised items: the last three planes are CoM (by hand, resampled onto the targets'
    grid) and the evaluation's iCoM baseline of the same simulated sample; the patterns are as stored."""
    path = _store(tiny_data_dir)
    ds = PhysicsSampleDataset([path], "dev", None, ("potential",), physics_inputs=NAMES)
    with stage.open_store(path) as store:
        sample = store[ds.global_indices[0]]
    item = ds[0]["cbed"].numpy()
    s, p, _ = sample.cbed.shape
    assert item.shape == (s + 3, p, p) and ds.cbed_shape == item.shape and ds.stack_shape == (s, p, p)
    np.testing.assert_allclose(item[:s], sample.cbed, rtol=1e-6)
    meta = sample.meta
    y0, x0, height, width = meta.fov_A
    first = np.asarray(meta.scan_positions_A).reshape(-1, 2)[0]
    shift = ((y0 - first[0]) / height, (x0 - first[1]) / width)
    com_y, com_x = _hand_com(sample)
    np.testing.assert_allclose(item[s], fourier_resample(com_y, (p, p), shift), atol=1e-5 * np.abs(com_y).max())
    np.testing.assert_allclose(item[s + 1], fourier_resample(com_x, (p, p), shift), atol=1e-5 * np.abs(com_x).max())
    icom = icom_from_sample(sample, output_shape=(p, p))
    np.testing.assert_allclose(item[s + 2], icom, rtol=1e-4, atol=1e-4 * np.abs(icom).max())
    # and it is physics, not noise: the iCoM plane follows the projected potential
    truth = sample.potential - sample.potential.mean()
    assert np.corrcoef(item[s + 2].ravel(), truth.ravel())[0, 1] > 0.3


def test_normalizer_records_physics_statistics_and_round_trips(tiny_data_dir):
    norm = stage.Normalizer.fit([_store(tiny_data_dir)], "log1p", physics_inputs=NAMES)
    assert set(norm.physics_stats) == set(NAMES) and all(std > 0 for _, std in norm.physics_stats.values())
    assert norm.calibration["scan_shape"] == [8, 8] and norm.calibration["energy_kv"] > 0
    again = stage.Normalizer.from_dict(json.loads(json.dumps(norm.to_dict())))
    assert again == norm and again.physics_stats == norm.physics_stats
    plain = stage.Normalizer.fit([_store(tiny_data_dir)], "log1p")
    assert "physics" not in plain.to_dict()  # cards of models without physics inputs are unchanged


def test_predict_on_a_raw_stack_builds_the_loaders_channels(tiny_data_dir):
    """`Reconstructor.network_input` of a raw stack (with the sample's calibration) is the loader's
    normalised item, patterns and physics planes alike; predict runs with and without a calibration."""
    path = _store(tiny_data_dir)
    norm = stage.Normalizer.fit([path], "log1p", physics_inputs=NAMES)
    ds = PhysicsSampleDataset([path], "dev", norm, ("potential",), physics_inputs=NAMES)
    with stage.open_store(path) as store:
        sample = store[ds.global_indices[0]]
    arch = ModelConfig(preset="tiny", physics_inputs=list(NAMES)).architecture()
    card = validate_card({"format": "namsa-reconstructor", "format_version": 1, "architecture": arch.to_dict(),
                          "targets": ["potential"], "normalizer": norm.to_dict(),
                          "files": {"model.safetensors": {"bytes": 0, "xxh3_128": "0" * 32}}}, "the test card")
    rec = Reconstructor(build_model(arch), card, torch.device("cpu"))
    cal = sample.meta.calibration
    x = rec.network_input(torch.from_numpy(sample.cbed)[None], [cal])
    np.testing.assert_allclose(x[0].numpy(), ds[0]["cbed"].numpy(), rtol=1e-4, atol=1e-4)
    assert rec.predict(sample.cbed, calibration=cal).shape == (1, 16, 16)
    assert rec.predict(sample.cbed[None]).shape == (1, 1, 16, 16)  # the card's typical calibration


def test_scan_layout_appends_the_maps_on_the_scan_grid():
    """Scan layout: the physics planes (on the P x P target grid) reach the stem, area-resampled to
    the scan grid: the output changes when only a physics plane changes."""
    torch.manual_seed(0)
    cfg = ModelConfig(preset="scan", in_channels=64, pattern_bins=4, levels=1, layers_per_block=[1, 1, 1],
                      physics_inputs=["icom"])
    model = build_model(cfg).eval()
    assert model.stem.in_channels == 16 + 1
    x = torch.randn(1, 65, 16, 16)
    y = x.clone()
    y[:, -1] += torch.randn(16, 16)
    with torch.no_grad():
        out_x, out_y = model(x), model(y)
    assert out_x.shape == (1, 1, 8, 8) and not torch.allclose(out_x, out_y)
    with pytest.raises(models.ModelConfigError, match=r"S=64 \+ 1 physics maps"):
        model(x[:, :64])


def test_relative_loss_weighs_a_light_and_a_heavy_sample_alike():
    """The same 10% relative error on a faint (light) and a 4x brighter (heavy) map: the absolute
    loss weighs the heavy sample 16x more, the relative loss weighs them equally."""
    torch.manual_seed(0)
    pattern = torch.rand(1, 1, 8, 8) + 0.5
    noise = torch.randn(1, 1, 8, 8)
    mean, std = 2.0, 1.0  # physical = standardised * std + mean
    norm = type("N", (), {"targets": {"potential": (mean, std)}})()
    loss = data_loss("relative", norm, ["potential"])

    def sample(amplitude: float) -> tuple[torch.Tensor, torch.Tensor]:
        truth = amplitude * pattern
        pred = truth + 0.1 * noise * truth.pow(2).mean().sqrt()
        return (pred - mean) / std, (truth - mean) / std

    (pl, tl), (ph, th) = sample(1.0), sample(4.0)
    absolute_ratio = float(huber_loss(ph, th, 10.0) / huber_loss(pl, tl, 10.0))
    relative_ratio = float(loss(ph, th, 10.0) / loss(pl, tl, 10.0))
    assert absolute_ratio == pytest.approx(16.0, rel=1e-4)
    assert relative_ratio == pytest.approx(1.0, rel=1e-4)
    assert data_loss("absolute", norm, ["potential"]) is huber_loss
    # a zero target is not divided by ~0
    zero = torch.full((1, 1, 8, 8), -mean / std)
    assert torch.isfinite(relative_huber_loss(zero + 1.0, zero, 1.0, torch.tensor([mean / std])))


@pytest.mark.usefixtures("one_thread")
def test_training_with_physics_inputs_and_relative_loss_end_to_end(tiny_data_dir, tmp_path):
    """A short real run: the card records the physics inputs, their statistics and the calibration;
    the exported model loads and predicts from a raw stack."""
    model_cfg = ModelConfig(preset="tiny", physics_inputs=list(NAMES))
    result = models.train(model_cfg, tiny_train_cfg(max_steps=3, eval_every=3, checkpoint_every=3,
                                                    loss_weighting="relative"),
                          None, DATA_CFG, [tiny_data_dir], tmp_path / "run")
    card = json.loads((Path(result.model_dir) / "model_card.json").read_text())
    assert card["architecture"]["physics_inputs"] == list(NAMES)
    assert set(card["normalizer"]["physics"]) == set(NAMES) and card["normalizer"]["calibration"]
    rec = models.load_reconstructor(result.model_dir, device="cpu")
    with stage.open_store(_store(tiny_data_dir)) as store:
        sample = store[0]
    out = rec.predict(sample.cbed, calibration=sample.meta.calibration)
    assert out.shape == (1, 16, 16) and np.isfinite(out).all()


def test_the_raw_gpu_path_gives_the_cpu_paths_input(tiny_data_dir):
    """``raw_cbed`` items (what a GPU run loads: patterns as stored, transformed on the device) end
    up as the same network input as the CPU path's normalised items, physics planes included."""
    from stage.dataset import collate_samples

    from models.training.data import _physics_batch_to_device

    path = _store(tiny_data_dir)
    norm = stage.Normalizer.fit([path], "log1p", physics_inputs=NAMES)
    cpu = PhysicsSampleDataset([path], "dev", norm, ("potential",), physics_inputs=NAMES)
    raw = PhysicsSampleDataset([path], "dev", norm, ("potential",), physics_inputs=NAMES, raw_cbed=True)
    batch = _physics_batch_to_device(collate_samples([raw[0], raw[1]]), torch.device("cpu"), norm, 64)
    expected = torch.stack([cpu[0]["cbed"], cpu[1]["cbed"]])
    np.testing.assert_allclose(batch["cbed"].numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
