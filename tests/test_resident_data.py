"""data.resident (stage.resident, stage.resident_loader): a split held in the training device's memory
yields the streaming loader's batches, draws its symmetry operations and shot noise on the device with
the host path's law, refuses what does not fit in one line, and trains (and resumes) for real. Here the
device is the CPU; the same code runs on cuda."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from scipy import stats

import models
import stage
from _train_helpers import DATA_CFG, one_thread, read_metrics, tiny_train_cfg  # noqa: F401
from models.training import TrainingError
from namsa.errors import MemoryShortage
from stage.config import DoseAugmentationConfig, SymmetryAugmentationConfig
from stage.dataset import batch_to_device
from stage.dose import DoseAugmentation
from stage.resident import KEEP_FRACTION, check_fits
from stage.resident_loader import load_resident, make_resident_loader
from stage.symmetry import OPS, SymmetryAugmentation, turn_maps, turn_stacks
from stage_helpers import CONFIG_HASH, check_poisson, make_sample

SPLIT = (0.7, 0.3, 0.0)
MATERIALS = [f"mp-{k}" for k in range(12)]
SYMMETRY = SymmetryAugmentationConfig(enabled=True, seed=3)
FIXED_DOSE = 4e4   # electrons/A^2: an 8 x 8 scan over 4 x 4 A puts 0.25 A^2, 1e4 electrons, per position
NOISY = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(FIXED_DOSE, FIXED_DOSE), clean_fraction=0.0)


def _sample(material: str, fov: tuple[float, ...]):
    """An 8 x 8 scan of 8 px patterns and 8 x 8 targets (rotations map it onto itself), each pattern
    with a dark first row: its minimum is 0 with or without noise, so the loaders' minimum shift is nil."""
    sample = make_sample(material, scan=(8, 8), px=8)
    cbed = sample.cbed.copy()
    cbed[:, 0, :] = 0.0
    cbed /= cbed.sum(axis=(1, 2), keepdims=True)
    return dataclasses.replace(sample, cbed=cbed, meta=sample.meta.replace(fov_A=fov))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A float16 store (the default) of 12 materials, train and dev; the first training material's
    field is 4 x 5 A (unequal scan steps: only the 4 operations that keep the axes)."""
    path = tmp_path_factory.mktemp("resident") / "w0"
    train = [m for m in MATERIALS if stage.split_of(m, SPLIT, 0) == "train"]
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=stage.DataConfig(split_fractions=SPLIT)) as writer:
        for m in MATERIALS:
            writer.put(_sample(m, (0.0, 0.0, 4.0, 5.0) if m == train[0] else (0.0, 0.0, 4.0, 4.0)))
    return path


@pytest.fixture(scope="module")
def norm(store):
    return stage.Normalizer.fit(store, "log1p")


def _raw(store, norm, split="train", **kw) -> stage.SampleDataset:
    return stage.SampleDataset(store, split, norm, targets=("potential", "density"), raw_cbed=True, **kw)


def _resident(store, norm, data_cfg: stage.DataConfig, batch: int, device: str = "cpu", **kw):
    loader = make_resident_loader(_raw(store, norm, light_oversample=data_cfg.light_oversample), data_cfg, batch,
                                  norm, **kw)
    load_resident([loader], device)
    return loader


def _epoch(loader, epoch: int, skip: int = 0) -> list[dict]:
    loader.set_epoch(epoch)
    loader.skip_batches(skip)
    return list(loader)


# ------------------------------------------------------------------ (1) the streaming loader's batches

@pytest.mark.parametrize("world_size, rank, mode, oversample", [(1, 0, "unique", 1), (2, 1, "unique", 1),
                                                                (2, 0, "shared", 1), (1, 0, "unique", 2)])
def test_the_resident_loader_yields_the_streaming_loaders_clean_batches(store, norm, world_size, rank, mode,
                                                                      oversample):
    """For a seed, epoch, rank and skip: the same positions (so sample ids) in the same order, and the
    same bytes as the streaming path's raw batch after the same transform (`batch_to_device`)."""
    cfg = stage.DataConfig(num_workers=0, pin_memory=False, shard_mode=mode,
                           light_oversample=oversample)
    kw = dict(rank=rank, world_size=world_size, seed=5)
    resident = _resident(store, norm, cfg, 2, **kw)
    streaming_ds = _raw(store, norm, light_oversample=oversample)
    streaming = stage.make_loader(streaming_ds, cfg, 2, **kw)
    held = resident.resident
    positions = np.flatnonzero(held.row_of_host >= 0)
    assert len(held) == len({streaming_ds.global_indices[k] for k in positions}) <= len(positions)
    assert (len(held) < len(positions)) == (oversample > 1), "an oversampled copy shares its sample's row"
    for epoch, skip in ((0, 0), (1, 1), (4, 0)):
        got = _epoch(resident, epoch, skip)
        want = _epoch(streaming, epoch, skip)
        assert len(got) == len(want) == len(streaming) - skip > 0
        for a, b in zip(got, want):
            assert a["index"].tolist() == b["index"].tolist()
            b = batch_to_device(b, "cpu", norm)
            assert torch.equal(a["cbed"], b["cbed"]) and a["cbed"].dtype == torch.float32
            assert torch.equal(a["target"], b["target"])
    ids = [streaming_ds.sample_id(k) for batch in _epoch(resident, 2) for k in batch["index"].tolist()]
    assert ids == [streaming_ds.sample_id(k) for batch in _epoch(streaming, 2) for k in batch["index"].tolist()]


def test_the_dev_split_is_held_in_order_and_unaugmented(store, norm):
    cfg = stage.DataConfig(num_workers=0, pin_memory=False, symmetry_augmentation=SYMMETRY,
                           dose_augmentation=NOISY)
    dev = make_resident_loader(_raw(store, norm, "dev"), cfg, 2, norm, shuffle=False, augment=False)
    load_resident([dev], "cpu", threads=2)
    streaming = stage.make_loader(_raw(store, norm, "dev"), cfg, 2, shuffle=False)
    got, want = _epoch(dev, 3), _epoch(streaming, 3)
    assert [a["index"].tolist() for a in got] == [b["index"].tolist() for b in want]
    assert sum(a["index"].numel() for a in got) == len(streaming.dataset), "the ragged last batch is kept"
    for a, b in zip(got, want):
        b = batch_to_device(b, "cpu", norm)
        assert torch.equal(a["cbed"], b["cbed"]) and torch.equal(a["target"], b["target"])


# ------------------------------------------------------------------ (2) symmetry on the device

def _turned_versions(store, norm) -> tuple[stage.SampleDataset, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Per training position, the 8 operations of `stage.symmetry` applied on the host to its stored
    sample: (normalised input, standardised targets) each."""
    ds = _raw(store, norm)
    versions = []
    for k in range(len(ds)):
        item = ds[k]
        raw, target = item["cbed"].numpy(), item["target"].numpy()
        versions.append([(norm.cbed(torch.from_numpy(turn_stacks(op, raw)), stored_scale=ds.storage_scale),
                          torch.from_numpy(np.ascontiguousarray(turn_maps(op, target)))) for op in OPS])
    return ds, versions


def test_symmetry_on_the_device_is_the_host_paths_operation_bit_for_bit(store, norm):
    cfg = stage.DataConfig(num_workers=0, pin_memory=False, symmetry_augmentation=SYMMETRY)
    resident = _resident(store, norm, cfg, 3, seed=1)
    streaming = stage.make_loader(_raw(store, norm, symmetry_augmentation=SYMMETRY), cfg, 3, seed=1)
    for epoch in range(3):
        for a, b in zip(_epoch(resident, epoch), _epoch(streaming, epoch), strict=True):
            assert a["index"].tolist() == b["index"].tolist()
            b = batch_to_device(b, "cpu", norm)
            assert torch.equal(a["cbed"], b["cbed"]) and torch.equal(a["target"], b["target"])


def test_each_element_is_one_of_the_eight_operations_drawn_with_the_host_paths_frequency(store, norm):
    """Over many epochs every batch element is exactly one of the 8 operations of its stored sample,
    the one the host path draws for (seed, epoch, sample id); each of the 8 (of the 4 on unequal scan
    steps) comes up as often as a uniform draw says, within a binomial interval of a family-wise 1e-6."""
    cfg = stage.DataConfig(num_workers=0, pin_memory=False, symmetry_augmentation=SYMMETRY)
    resident = _resident(store, norm, cfg, 4, seed=2)
    ds, versions = _turned_versions(store, norm)
    metas = ds.position_metas(range(len(ds)))
    host = SymmetryAugmentation(SYMMETRY)
    square = [m.fov_A[2] == m.fov_A[3] for m in metas]
    counts = {True: np.zeros(8, int), False: np.zeros(8, int)}
    for epoch in range(150):
        for batch in _epoch(resident, epoch):
            for j, k in enumerate(batch["index"].tolist()):
                match = [i for i, (x, y) in enumerate(versions[k])
                         if torch.equal(batch["target"][j], y) and torch.equal(batch["cbed"][j], x)]
                assert len(match) == 1, f"position {k}: not exactly one of the 8 operations ({match})"
                allowed = OPS if square[k] else OPS[:4]
                assert OPS[match[0]] == host.draw(metas[k], epoch, allowed)
                counts[square[k]][match[0]] += 1
    assert counts[False][4:].sum() == 0, "unequal scan steps: no transpose"
    cells = [(counts[True], 8), (counts[False][:4], 4)]
    alpha = 1e-6 / sum(n for _, n in cells)
    for observed, n_ops in cells:
        total = int(observed.sum())
        assert total >= 100
        low, high = stats.binom.interval(1 - alpha, total, 1 / n_ops)
        assert np.all((observed >= low) & (observed <= high)), (observed, low, high)


# ------------------------------------------------------------------ (3) shot noise on the device

def _counts_view(norm: stage.Normalizer, storage_scale: float) -> stage.Normalizer:
    """A Normalizer whose transform leaves stored-scale intensities as they are (none, mean 0, std 1,
    intensity scale = the store's): with the dark row's zero minimum the loader then delivers counts / N
    on the stored scale."""
    return stage.Normalizer("none", 0.0, 1.0, norm.targets, intensity_scale=storage_scale)


def _check_device_noise(store, norm, device: str, k: int = 0) -> None:
    """The counts a resident set on ``device`` draws for training position ``k`` over 400 epochs have
    mean N I and variance N I per pixel (`check_poisson`)."""
    ds = _raw(store, norm)
    cfg = stage.DataConfig(num_workers=0, pin_memory=False, dose_augmentation=NOISY)
    resident = make_resident_loader(ds, cfg, 4, _counts_view(norm, ds.storage_scale), seed=0)
    load_resident([resident], device)
    clean = stage.SampleDataset(store, "train", None)[k]["cbed"].numpy().astype(np.float64)   # as stored
    electrons = FIXED_DOSE * ds.position_metas([k])[0].scan_step_area_A2
    draws = []
    for epoch in range(400):
        for batch in _epoch(resident, epoch):
            at = batch["index"].tolist()
            if k in at:
                draws.append(batch["cbed"][at.index(k)].cpu().numpy().astype(np.float64) / ds.storage_scale)
    check_poisson(np.stack(draws), clean, electrons)


def test_device_noise_follows_poisson_like_the_host_paths(store, norm):
    """The counts of a resident set (one Poisson draw per batch on the device) and of the host path
    (numpy, in the loader) both have mean N I and variance N I per pixel, on the same stored sample."""
    k = 0
    _check_device_noise(store, norm, "cpu", k)
    clean = stage.SampleDataset(store, "train", None)[k]["cbed"].numpy().astype(np.float64)   # as stored
    electrons = FIXED_DOSE * _raw(store, norm).position_metas([k])[0].scan_step_area_A2
    host_ds = stage.SampleDataset(store, "train", None, dose_augmentation=NOISY)
    host = []
    for epoch in range(400):
        host_ds.set_epoch(epoch)
        host.append(host_ds[k]["cbed"].numpy().astype(np.float64))
    check_poisson(np.stack(host), clean, electrons)


def test_device_noise_draws_the_host_paths_doses_is_reproducible_and_resumes(store, norm):
    """Doses and clean samples are the host path's for (seed, epoch, sample id); the same seed draws
    the same counts, and a run resumed at batch b draws batch b's counts again."""
    dose = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(1e2, 1e4), clean_fraction=0.3, seed=4)
    cfg = stage.DataConfig(num_workers=0, pin_memory=False, dose_augmentation=dose, symmetry_augmentation=SYMMETRY)
    first, second = (_resident(store, norm, cfg, 2, seed=6) for _ in range(2))
    ds = _raw(store, norm)
    metas = ds.position_metas(range(len(ds)))
    clean = _resident(store, norm, stage.DataConfig(num_workers=0, pin_memory=False, symmetry_augmentation=SYMMETRY),
                      2, seed=6)
    for epoch in range(4):
        electrons = first.draws.compute(epoch).electrons
        for k, meta in enumerate(metas):
            drawn = DoseAugmentation(dose).apply(np.zeros((64, 8, 8), np.float32), meta, epoch)
            assert electrons[k] == np.float32(0.0 if drawn is None else drawn * meta.scan_step_area_A2)
        a, b, c = _epoch(first, epoch), _epoch(second, epoch), _epoch(clean, epoch)
        for x, y, z in zip(a, b, c, strict=True):
            assert torch.equal(x["cbed"], y["cbed"]), "the same seed draws the same counts"
            for j, k in enumerate(x["index"].tolist()):
                assert torch.equal(x["cbed"][j], z["cbed"][j]) == (electrons[k] == 0), "clean exactly when no dose"
        resumed = _epoch(second, epoch, skip=1)
        assert all(torch.equal(x["cbed"], y["cbed"]) for x, y in zip(a[1:], resumed, strict=True))
    first.close()
    second.close()


@pytest.mark.gpu
def test_on_cuda_the_batches_are_the_streaming_paths_and_the_noise_is_poisson(store, norm):
    """The same checks on a GPU: clean and turned batches equal the streaming path's raw batch moved to
    and transformed on the GPU, bit for bit; the counts drawn there follow Poisson(N I); the memory
    check reads the GPU's free memory."""
    for cfg in (stage.DataConfig(num_workers=2), stage.DataConfig(num_workers=2, symmetry_augmentation=SYMMETRY)):
        resident = _resident(store, norm, cfg, 3, "cuda", seed=4)
        assert resident.resident.cbed.is_cuda and resident.resident.cbed.dtype == torch.float16
        streaming = stage.make_loader(_raw(store, norm, symmetry_augmentation=cfg.symmetry_augmentation),
                                      cfg.model_copy(update={"loader": "processes", "num_workers": 0}), 3, seed=4)
        for epoch in range(2):
            for a, b in zip(_epoch(resident, epoch), _epoch(streaming, epoch), strict=True):
                assert a["index"].tolist() == b["index"].tolist()
                b = batch_to_device(b, "cuda", norm)
                assert a["cbed"].is_cuda and torch.equal(a["cbed"], b["cbed"]) and torch.equal(a["target"], b["target"])
    _check_device_noise(store, norm, "cuda")


# ------------------------------------------------------------------ (4) the memory refusal

def test_splits_that_do_not_fit_are_refused_in_one_line_before_reading(store, norm):
    from workflow.errors import exit_status

    loader = make_resident_loader(_raw(store, norm), stage.DataConfig(), 2, norm)
    need = loader.resident.nbytes + loader.resident.batch_bytes(2)
    check_fits([loader.resident], 2, "cpu")                               # this machine holds it
    check_fits([loader.resident], 2, "cpu", free=need / (1 - KEEP_FRACTION))
    with pytest.raises(MemoryShortage) as info:
        check_fits([loader.resident], 2, "cpu", free=need)
    text = str(info.value)
    assert "\n" not in text and exit_status(info.value) == 2
    assert re.search(rf"data\.resident: {len(loader.resident)} samples \(.* GiB as stored\)", text)
    assert "set data.resident false" in text and "training.max_train_samples" in text
    assert loader.resident.cbed is None, "nothing was read"


# ------------------------------------------------------------------ (5) training on it

def _train(out, data_dir, data_cfg: stage.DataConfig, model_cfg=None, resume: bool = False, **train):
    return models.train(model_cfg or models.ModelConfig(preset="tiny"), tiny_train_cfg(**train), None, data_cfg,
                        [data_dir], out, resume=resume)


RESIDENT = DATA_CFG.model_copy(update={"resident": True})


@pytest.mark.usefixtures("one_thread")
def test_training_on_a_resident_set_matches_streaming_and_resumes(tiny_data_dir, tmp_path):
    """Augmentations off, a resident run trains on the streaming run's batches (the same losses up to the
    transform's rounding: numpy in the CPU loader, torch here). With the shot noise on, it runs its steps
    with finite losses, and one stopped at step 5 and resumed to 8 ends with the uninterrupted run's weights."""
    steps = dict(max_steps=8, eval_every=4, checkpoint_every=4)
    streamed = _train(tmp_path / "streamed", tiny_data_dir, DATA_CFG, **steps)
    held = _train(tmp_path / "held", tiny_data_dir, RESIDENT, **steps)
    a, b = read_metrics(streamed.metrics_csv), read_metrics(held.metrics_csv)
    assert held.steps == streamed.steps == 8 and len(a) == len(b)
    np.testing.assert_allclose([float(r["train_loss"]) for r in b], [float(r["train_loss"]) for r in a], rtol=1e-4)
    assert held.final_dev_loss == pytest.approx(streamed.final_dev_loss, rel=1e-4)

    noisy = RESIDENT.model_copy(update={"dose_augmentation": DoseAugmentationConfig(enabled=True)})
    whole = _train(tmp_path / "whole", tiny_data_dir, noisy, **steps)
    losses = [float(r["train_loss"]) for r in read_metrics(whole.metrics_csv)]
    assert whole.steps == 8 and np.all(np.isfinite(losses))
    assert losses != [float(r["train_loss"]) for r in b], "the noise reaches the batches"
    _train(tmp_path / "cut", tiny_data_dir, noisy, **{**steps, "max_steps": 5})
    resumed = _train(tmp_path / "cut", tiny_data_dir, noisy, resume=True, **steps)
    assert resumed.steps == 8
    assert [r["train_loss"] for r in read_metrics(resumed.metrics_csv)] == [
        r["train_loss"] for r in read_metrics(whole.metrics_csv)]
    from safetensors.torch import load_file

    final = "checkpoints/step-00000008/model.safetensors"
    x, y = load_file(str(tmp_path / "cut" / final)), load_file(str(tmp_path / "whole" / final))
    assert all(torch.equal(x[k], y[k]) for k in x)


def test_physics_inputs_are_refused_with_a_resident_set(tiny_data_dir, tmp_path):
    model = models.ModelConfig(preset="tiny", physics_inputs=["icom"])
    with pytest.raises(TrainingError, match="data.resident cannot serve model.physics_inputs"):
        _train(tmp_path / "run", tiny_data_dir, RESIDENT, model_cfg=model, max_steps=1)
