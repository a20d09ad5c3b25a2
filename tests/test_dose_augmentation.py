"""Dose as augmentation (stage.dose): Poisson statistics, the dose distribution, reproducibility
from (seed, epoch, sample id), and the loader path end to end over real stores."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from scipy import stats

import stage
from namsa.errors import UserError
from stage.config import DoseAugmentationConfig
from stage.dataset import batch_to_device, collate_samples
from stage.device_noise import noisy_batch_to_device
from stage.dose import DoseAugmentation, add_shot_noise, augmentation_rng, draw_dose
from stage_helpers import CONFIG_HASH, check_poisson, make_sample, make_samples

FIXED_DOSE = 2500.0  # electrons/A^2; the helpers' 2 x 2 scan over 4 x 4 A puts 4 A^2 per position
ELECTRONS = FIXED_DOSE * 4.0
NOISY = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(FIXED_DOSE, FIXED_DOSE), clean_fraction=0.0)
ON_DEVICE = NOISY.model_copy(update={"on_device": True})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One float16 store (the default) of 6 materials, all in the training split but two."""
    path = tmp_path_factory.mktemp("dose") / "w0"
    with stage.StoreWriter(path, config_hash=CONFIG_HASH,
                           data_cfg=stage.DataConfig(split_fractions=(0.6, 0.2, 0.2))) as writer:
        for sample in make_samples(6):
            writer.put(sample)
    return path


def _draws(ds: stage.SampleDataset, index: int, epochs: range) -> np.ndarray:
    out = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        out.append(ds[index]["cbed"].numpy().astype(np.float64))
    return np.stack(out)


def test_shot_noise_has_poisson_mean_and_variance_on_a_known_pattern():
    yy, xx = np.mgrid[:16, :16] - 8
    clean = np.exp(-(yy**2 + xx**2) / 20.0)
    clean[0, :] = 0.0
    clean /= clean.sum()
    electrons = 3000.0
    rng = np.random.default_rng(0)
    draws = np.repeat(clean[None].astype(np.float32), 2000, axis=0)
    add_shot_noise(draws, electrons, rng)
    check_poisson(draws.astype(np.float64), clean.astype(np.float32).astype(np.float64), electrons)


def test_shot_noise_keeps_the_storage_scale_of_float16_buffers():
    clean = np.full((4, 8, 8), 1 / 64, np.float64)
    scale = 64.0
    stored = (clean * scale).astype(np.float16)
    add_shot_noise(stored, 1e4, np.random.default_rng(1), scale)
    assert stored.dtype == np.float16
    assert stored.astype(np.float64).mean() / scale == pytest.approx(1 / 64, rel=0.02)
    tiny = np.full((1, 2, 2), 0.5 * 32768, np.float16)  # half the dose in one pixel, scale 2^15
    add_shot_noise(tiny, 0.5, np.random.default_rng(3), 32768.0)
    assert np.isfinite(tiny.astype(np.float32)).all(), "a big count must clip to float16's max, not inf"


def test_loader_draws_have_poisson_statistics_on_a_real_stored_sample(store):
    clean_ds = stage.SampleDataset(store, "train", None)
    noisy_ds = stage.SampleDataset(store, "train", None, dose_augmentation=NOISY)
    clean = clean_ds[0]["cbed"].numpy().astype(np.float64)
    assert stage.open_store(store).meta(noisy_ds.global_indices[0]).scan_step_area_A2 == 4.0
    check_poisson(_draws(noisy_ds, 0, range(400)), clean, ELECTRONS)


def test_normalised_and_raw_fp16_items_carry_the_same_noise(store):
    norm = stage.Normalizer.fit(store, "log1p")
    ref = stage.SampleDataset(store, "train", norm, dose_augmentation=NOISY)
    raw = stage.SampleDataset(store, "train", norm, raw_cbed=True, dose_augmentation=NOISY)
    for ds in (ref, raw):
        ds.set_epoch(7)
    clean = stage.SampleDataset(store, "train", norm)[1]["cbed"]
    want = ref[1]["cbed"]
    got = batch_to_device(stage.dataset.collate_samples([raw[1]]), "cpu", norm)["cbed"][0]
    # the raw path rounds counts * scale / N to float16: 2^-11 relative, far below the noise
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    assert (want - clean).abs().max() > 0.05


def test_dose_is_log_uniform_over_the_range_and_clean_fraction_is_respected():
    cfg = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(1e2, 1e6), clean_fraction=0.1, seed=4)
    doses = [draw_dose(cfg, augmentation_rng(cfg.seed, 0, f"s{i}")) for i in range(20000)]
    drawn = np.array([d for d in doses if d is not None])
    clean = 1 - drawn.size / len(doses)
    assert clean == pytest.approx(0.1, abs=5 * np.sqrt(0.1 * 0.9 / len(doses)))
    assert drawn.min() >= 1e2 and drawn.max() <= 1e6
    assert stats.kstest(np.log10(drawn), stats.uniform(loc=2, scale=4).cdf).pvalue > 1e-4
    per_decade = np.histogram(np.log10(drawn), bins=[2, 3, 4, 5, 6])[0] / drawn.size
    np.testing.assert_allclose(per_decade, 0.25, atol=0.02)


def test_linear_dose_and_clean_fraction_extremes():
    linear = DoseAugmentationConfig(dose_range_e_per_A2=(1e2, 1e4), log_uniform=False, clean_fraction=0.0)
    drawn = np.array([draw_dose(linear, augmentation_rng(0, 1, f"s{i}")) for i in range(5000)])
    assert stats.kstest(drawn, stats.uniform(loc=1e2, scale=1e4 - 1e2).cdf).pvalue > 1e-4
    always_clean = DoseAugmentationConfig(clean_fraction=1.0)
    assert all(draw_dose(always_clean, augmentation_rng(0, 1, f"s{i}")) is None for i in range(200))


def test_noise_is_reproducible_from_seed_epoch_and_sample_id(store):
    def read(seed: int, epoch: int, index: int) -> np.ndarray:
        ds = stage.SampleDataset(store, "train", None, dose_augmentation=NOISY.model_copy(update={"seed": seed}))
        ds.set_epoch(epoch)
        return ds[index]["cbed"].numpy()

    first = read(0, 3, 1)
    np.testing.assert_array_equal(read(0, 3, 1), first)
    assert not np.array_equal(read(0, 4, 1), first), "another epoch must draw other noise"
    assert not np.array_equal(read(1, 3, 1), first), "another seed must draw other noise"
    # the stream is keyed by the sample id, not the dataset position: applying the augmentation
    # by hand to the clean stack of the same sample gives the same array
    clean_ds = stage.SampleDataset(store, "train", None)
    by_hand = clean_ds[1]["cbed"].numpy().copy()
    meta = stage.open_store(store).meta(clean_ds.global_indices[1])
    assert DoseAugmentation(NOISY).apply(by_hand, meta, 3) == FIXED_DOSE
    np.testing.assert_array_equal(by_hand, first)


@pytest.mark.parametrize("loader", ["processes", "threads"])
def test_loader_noise_is_independent_of_workers_and_follows_set_epoch(store, loader):
    """Persistent worker processes (forked before set_epoch(1)) and reader threads deliver the
    same noisy items as reading in the calling thread, epoch by epoch."""
    ds = stage.SampleDataset(store, "train", None, dose_augmentation=NOISY)

    def epochs(workers: int) -> list[dict[int, np.ndarray]]:
        cfg = stage.DataConfig(num_workers=workers, loader=loader)
        ld = stage.make_loader(ds, cfg, 2, shuffle=True, seed=2)
        seen = []
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            seen.append({int(k): b["cbed"][j].numpy().copy() for b in ld for j, k in enumerate(b["index"])})
        if hasattr(ld, "close"):
            ld.close()
        return seen

    parallel, serial = epochs(2), epochs(0)
    for e in (0, 1):
        assert parallel[e].keys() == serial[e].keys()
        for k in serial[e]:
            np.testing.assert_array_equal(parallel[e][k], serial[e][k])
    k = next(iter(serial[0].keys() & serial[1].keys()))
    assert not np.array_equal(serial[0][k], serial[1][k])


def test_only_the_training_split_is_augmented_and_default_is_off(store):
    for split in ("dev", "test"):
        stored = stage.SampleDataset(store, split, None)[0]["cbed"]
        torch.testing.assert_close(stage.SampleDataset(store, split, None, dose_augmentation=NOISY)[0]["cbed"], stored,
                                   rtol=0, atol=0)
    assert stage.DataConfig().dose_augmentation.enabled is False
    assert stage.DataConfig().dose_augmentation.on_device is False
    default = stage.SampleDataset(store, "train", None, dose_augmentation=stage.DataConfig().dose_augmentation)
    torch.testing.assert_close(default[0]["cbed"], stage.SampleDataset(store, "train", None)[0]["cbed"], rtol=0, atol=0)


def test_a_sample_simulated_with_noise_is_never_noised_again():
    sample = make_sample("mp-1")
    noisy = sample.meta.replace(dose_e_per_A2=1000.0)
    cbed = sample.cbed.copy()
    assert DoseAugmentation(NOISY).apply(cbed, noisy, 0) is None
    np.testing.assert_array_equal(cbed, sample.cbed)


@pytest.mark.parametrize("bad, says", [
    ({"dose_range_e_per_A2": (0, 1e6)}, "0 < low <= high"),
    ({"dose_range_e_per_A2": (1e6, 1e2)}, "0 < low <= high"),
    ({"dose_range_e_per_A2": (1e2, float("inf"))}, "0 < low <= high"),
    ({"clean_fraction": -0.1}, "give a number in [0, 1]"),
    ({"clean_fraction": 1.5}, "give a number in [0, 1]"),
    ({"seed": -1}, "greater than or equal to 0"),
])
def test_bad_dose_settings_are_refused(bad, says):
    with pytest.raises(ValidationError, match=re.escape(says)):
        DoseAugmentationConfig(**bad)


def test_training_enables_it_with_a_set_override():
    from workflow.config import load_config

    cfg = load_config(None, ["data.dose_augmentation.enabled=true",
                             "data.dose_augmentation.dose_range_e_per_A2=[1000,100000]"])
    assert cfg.data.dose_augmentation.enabled is True
    assert cfg.data.dose_augmentation.dose_range_e_per_A2 == (1e3, 1e5)


# --------------------------------------------------------------- noise drawn on the device (on_device)

def _device_items(ds: stage.SampleDataset, indices: list[int], normalizer: stage.Normalizer | None = None
                  ) -> torch.Tensor:
    """The training step's view of a batch of ``indices``: noise drawn by torch (here on the CPU)."""
    return noisy_batch_to_device(collate_samples([ds[k] for k in indices]), "cpu", normalizer, ds)["cbed"]


def test_device_noise_has_the_host_paths_poisson_statistics(store):
    clean = stage.SampleDataset(store, "train", None)[0]["cbed"].numpy().astype(np.float64)
    device_ds = stage.SampleDataset(store, "train", None, dose_augmentation=ON_DEVICE)
    np.testing.assert_array_equal(device_ds[0]["cbed"].numpy(), clean)  # the loader delivers it clean
    draws = []
    for epoch in range(400):
        device_ds.set_epoch(epoch)
        draws.append(_device_items(device_ds, [0])[0].numpy().astype(np.float64))
    device = np.stack(draws)
    host = _draws(stage.SampleDataset(store, "train", None, dose_augmentation=NOISY), 0, range(400))
    for noisy in (device, host):   # the same test of the law on both paths
        check_poisson(noisy, clean, ELECTRONS)
    assert not np.array_equal(device[0], device[1]), "each epoch draws other counts"


def test_device_path_draws_the_host_paths_doses_and_clean_fraction():
    cfg = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(1e2, 1e6), clean_fraction=0.3, seed=5)
    device, host = DoseAugmentation(cfg.model_copy(update={"on_device": True})), DoseAugmentation(cfg)
    samples = [make_sample(f"mp-{i}") for i in range(50)]
    drawn = []
    for epoch in range(20):
        for sample in samples:
            dose, seed = device.device_draw(sample.meta, epoch)
            assert dose == host.apply(sample.cbed.copy(), sample.meta, epoch)   # None (clean) included
            assert dose is None or 0 <= seed < 2 ** 63
            drawn.append(dose)
    clean = sum(d is None for d in drawn) / len(drawn)
    assert clean == pytest.approx(0.3, abs=5 * np.sqrt(0.3 * 0.7 / len(drawn)))


def test_device_noise_is_reproducible_and_clean_samples_stay_clean(store):
    half = ON_DEVICE.model_copy(update={"clean_fraction": 0.5, "dose_range_e_per_A2": (1e2, 1e4)})
    ds, clean_ds = (stage.SampleDataset(store, "train", None, dose_augmentation=half),
                    stage.SampleDataset(store, "train", None))
    indices = list(range(len(ds)))
    for epoch in range(6):
        ds.set_epoch(epoch)
        draws = ds.device_noise_draws(indices)
        got = _device_items(ds, indices)
        torch.testing.assert_close(_device_items(ds, indices), got, rtol=0, atol=0)  # same (seed, epoch, id)
        for k, (electrons, _) in enumerate(draws):
            meta = stage.open_store(store).meta(ds.global_indices[k])
            dose = DoseAugmentation(half).apply(clean_ds[k]["cbed"].numpy(), meta, epoch)
            assert electrons == (0.0 if dose is None else dose * meta.scan_step_area_A2)
            same = torch.equal(got[k], clean_ds[k]["cbed"])
            assert same == (electrons == 0.0), "clean exactly when no dose was drawn"


def test_device_noise_comes_before_the_transform_of_raw_fp16_batches(store):
    """With nothing to draw, the raw fp16 batch transformed after the (skipped) noise is the host
    path's normalised item; a normalised dataset is refused, it could not be noised any more."""
    norm = stage.Normalizer.fit(store, "log1p")
    never = ON_DEVICE.model_copy(update={"clean_fraction": 1.0})
    raw = stage.SampleDataset(store, "train", norm, raw_cbed=True, dose_augmentation=never)
    want = torch.stack([stage.SampleDataset(store, "train", norm)[k]["cbed"] for k in (0, 1)])
    torch.testing.assert_close(_device_items(raw, [0, 1], norm), want, rtol=1e-5, atol=1e-5)
    noisy_raw = stage.SampleDataset(store, "train", norm, raw_cbed=True, dose_augmentation=ON_DEVICE)
    assert (_device_items(noisy_raw, [0, 1], norm) - want).abs().max() > 0.05
    with pytest.raises(UserError, match="raw_cbed=True"):
        stage.SampleDataset(store, "train", norm, dose_augmentation=ON_DEVICE)


def test_device_noise_with_physics_inputs_is_refused(store):
    """The physics maps are computed in the loader: from clean patterns they would not match the noisy input."""
    from stage.physics_dataset import PhysicsSampleDataset

    with pytest.raises(UserError, match="on_device: false with model.physics_inputs"):
        PhysicsSampleDataset(store, "train", None, physics_inputs=("icom",), dose_augmentation=ON_DEVICE)
