"""The camera as augmentation (stage.camera_augmentation): off it changes nothing; on, the host path
(numpy, in the loader), the streaming device path (stage.device_noise) and the resident set
(stage.resident_batch) draw the same cameras from (seed, epoch, sample id) and deliver patterns of the
same law (blur, read noise, clip at 0, total kept); the config refuses what it cannot mean in one line;
a real training run with it on records it on its card."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import models
import stage
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401
from namsa.errors import UserError
from stage.camera_augmentation import CameraAugmentation, CameraDraw, apply_camera, gaussian_mtf
from stage.config import CameraAugmentationConfig, DoseAugmentationConfig
from stage.dataset import collate_samples
from stage.device_noise import noisy_batch_to_device
from stage.resident_loader import load_resident, make_resident_loader
from stage_helpers import CONFIG_HASH, make_sample

SPLIT = (0.7, 0.3, 0.0)
FIXED_DOSE = 400.0   # electrons/A^2: an 8 x 8 scan over 4 x 4 A puts 0.25 A^2, 100 electrons, per position
NOISY = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(FIXED_DOSE, FIXED_DOSE), clean_fraction=0.0)
#: every noisy sample through one camera: sigma 1 px and 1 electron of read noise (about the signal of a
#: typical pixel at this dose: the clip at 0 sets 13% of the pixels to 0 and lifts the total by ~1%)
CAMERA = CameraAugmentationConfig(enabled=True, integrating_fraction=1.0, psf_sigma_px=(1.0, 1.0),
                                  read_noise_e=(1.0, 1.0), seed=5)
DRAWS = 300   # epochs of one sample per path in the statistics tests


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A float16 store (the default) of 8 materials of 8 x 8 scans of 8 px patterns, train and dev."""
    path = tmp_path_factory.mktemp("camera") / "w0"
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=stage.DataConfig(split_fractions=SPLIT)) as writer:
        for m in range(8):
            writer.put(make_sample(f"mp-{m}", scan=(8, 8), px=8))
    return path


@pytest.fixture(scope="module")
def counts_view(store) -> stage.Normalizer:
    """A Normalizer whose transform only shifts each pattern to a minimum of 0 (no compression, mean 0,
    std 1, intensity scale = the store's): every path then delivers stored-scale intensities, shifted."""
    fitted = stage.Normalizer.fit(store, "log1p")
    return stage.Normalizer("none", 0.0, 1.0, fitted.targets, intensity_scale=fitted.intensity_scale)


def _data_cfg(camera: CameraAugmentationConfig | None = CAMERA, on_device: bool = False,
              dose: DoseAugmentationConfig = NOISY) -> stage.DataConfig:
    noise = dose.model_copy(update={"on_device": on_device})
    return stage.DataConfig(num_workers=0, pin_memory=False, dose_augmentation=noise,
                            camera_augmentation=camera or CameraAugmentationConfig())


def _dataset(store, norm, cfg: stage.DataConfig, raw: bool = False) -> stage.SampleDataset:
    return stage.SampleDataset(store, "train", norm, raw_cbed=raw, dose_augmentation=cfg.dose_augmentation,
                               camera_augmentation=cfg.camera_augmentation)


def _host(store, norm, cfg: stage.DataConfig, k: int, epochs: range) -> np.ndarray:
    """(epochs, S, P, P) float64: position ``k`` as the host path delivers it in each epoch."""
    ds = _dataset(store, norm, cfg)
    out = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        out.append(ds[k]["cbed"].numpy().astype(np.float64))
    return np.stack(out)


def _streaming_device(store, norm, cfg: stage.DataConfig, k: int, epochs: range) -> np.ndarray:
    """The same through the streaming device path (noise and camera drawn by `noisy_batch_to_device`)."""
    ds = _dataset(store, norm, cfg.model_copy(update={"dose_augmentation": cfg.dose_augmentation.model_copy(
        update={"on_device": True})}), raw=True)
    out = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        batch = noisy_batch_to_device(collate_samples([ds[k]]), "cpu", norm, ds)
        out.append(batch["cbed"][0].numpy().astype(np.float64))
    return np.stack(out)


def _resident(store, norm, cfg: stage.DataConfig, k: int, epochs: range) -> np.ndarray:
    """The same through a resident set on the CPU (one batch of every training sample per epoch)."""
    ds = stage.SampleDataset(store, "train", norm, raw_cbed=True)
    loader = make_resident_loader(ds, cfg, len(ds), norm, seed=0)
    load_resident([loader], "cpu")
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        (batch,) = list(loader)
        out.append(batch["cbed"][batch["index"].tolist().index(k)].numpy().astype(np.float64))
    loader.close()
    return np.stack(out)


# ------------------------------------------------------------------ off: nothing changes

@pytest.mark.parametrize("camera", [None, CAMERA.model_copy(update={"enabled": False}),
                                    CAMERA.model_copy(update={"integrating_fraction": 0.0})])
def test_off_or_at_fraction_zero_every_path_delivers_todays_patterns_bit_for_bit(store, counts_view, camera):
    today = _data_cfg(None)
    epochs = range(3)
    for path in (_host, _streaming_device, _resident):
        before = path(store, counts_view, today, 0, epochs)
        after = path(store, counts_view, _data_cfg(camera), 0, epochs)
        np.testing.assert_array_equal(after, before)


# ------------------------------------------------------------------ on: one law on every path

def test_every_path_draws_the_host_paths_cameras_and_fraction(store, counts_view):
    """Whether a noisy sample is seen through the camera, its sigma and read noise are the host path's
    draw for (seed, epoch, sample id) on the streaming device path and the resident set, and the share
    seen is ``integrating_fraction`` (binomial bound)."""
    camera = CameraAugmentationConfig(enabled=True, integrating_fraction=0.3, seed=11)
    cfg = _data_cfg(camera, on_device=True)
    ds = _dataset(store, counts_view, cfg, raw=True)
    loader = make_resident_loader(stage.SampleDataset(store, "train", counts_view, raw_cbed=True), cfg, 2, counts_view)
    metas = ds.position_metas(range(len(ds)))
    seen = []
    for epoch in range(60):
        ds.set_epoch(epoch)
        streaming = ds.device_camera_draws(range(len(ds)))
        resident = loader.draws.compute(epoch)
        for k, meta in enumerate(metas):
            host, _ = CameraAugmentation(camera).draw(meta, epoch)
            assert streaming[k] == host
            assert resident.seen[k] == (host is not None)
            if host is not None:
                assert (resident.sigma_px[k], resident.read_noise_e[k]) == (np.float32(host.sigma_px),
                                                                          np.float32(host.read_noise_e))
                assert camera.psf_sigma_px[0] <= host.sigma_px <= camera.psf_sigma_px[1]
                assert camera.read_noise_e[0] <= host.read_noise_e <= camera.read_noise_e[1]
            seen.append(host is not None)
    n = len(seen)
    assert abs(np.mean(seen) - 0.3) < 5 * np.sqrt(0.3 * 0.7 / n)
    assert len({CameraAugmentation(CAMERA.model_copy(update={"psf_sigma_px": (0.5, 2.0)})).draw(metas[0], e)[0]
                for e in range(5)}) == 5, "a new camera each epoch"


def _compare(a: np.ndarray, b: np.ndarray) -> None:
    """Two sets of K independent draws (K, ...) of one law: per pixel, the means within sampling error, the
    share of draws clipped to 0 within a binomial's, and, where the clip leaves a pixel alone (under 5% of
    draws at 0 on both), the variances in the ratio an F(K - 1, K - 1) allows (log ratio sd sqrt(4 / K))."""
    k = a.shape[0]
    va, vb = a.var(axis=0, ddof=1), b.var(axis=0, ddof=1)
    z = (a.mean(axis=0) - b.mean(axis=0)) / np.sqrt(np.maximum(va + vb, 1e-30) / k)
    assert np.abs(z).max() < 6 and abs(z.mean()) < 0.3, ("means", np.abs(z).max(), z.mean())
    za, zb = (a == 0).mean(axis=0), (b == 0).mean(axis=0)
    pooled = (za + zb) / 2
    spread = np.sqrt(np.maximum(pooled * (1 - pooled) * 2 / k, 1e-30))
    assert np.all(np.abs(za - zb) < 6 * spread + 1e-12), ("clipped shares", np.abs(za - zb).max())
    free = (za < 0.05) & (zb < 0.05)
    assert free.mean() > 0.2, "enough pixels are left alone by the clip to compare variances"
    log_ratio = np.log(va[free] / vb[free])
    bound = np.sqrt(4 / k)
    assert np.abs(log_ratio).max() < 6 * bound and abs(log_ratio.mean()) < bound, \
        ("variances", np.abs(log_ratio).max(), log_ratio.mean())


def test_host_and_device_paths_deliver_the_same_law(store, counts_view):
    """One sample through one camera (sigma 1 px, read noise 1 e, clipped, total kept), DRAWS epochs on each
    path: the host path's per-pixel means, clipped shares and variances are the streaming device path's and
    the resident set's within sampling error; its noise is correlated between neighbouring pixels (the
    blur), the counts' alone is not."""
    epochs = range(DRAWS)
    host = _host(store, counts_view, _data_cfg(), 0, epochs)
    _compare(_streaming_device(store, counts_view, _data_cfg(), 0, epochs), host)
    _compare(_resident(store, counts_view, _data_cfg(), 0, epochs), host)
    counted = _host(store, counts_view, _data_cfg(None), 0, epochs)
    assert abs(_neighbour_correlation(counted)) < 0.02 < 0.05 < _neighbour_correlation(host)


def _neighbour_correlation(draws: np.ndarray) -> float:
    """The correlation of the fluctuations (about the per-pixel mean over draws) of horizontal neighbours."""
    r = draws - draws.mean(axis=0)
    return float((r[..., :, 1:] * r[..., :, :-1]).mean() / (r ** 2).mean())


def test_without_read_noise_the_mean_is_the_blurred_pattern_and_the_total_is_kept():
    """At read noise 0 nothing is clipped: over many draws the host arithmetic's mean is the clean pattern
    blurred by the scintillator's MTF (within sampling error), and every draw keeps the counts' total."""
    px, electrons = 16, 2000.0
    yy, xx = np.mgrid[:px, :px] - px // 2
    clean = np.exp(-(yy ** 2 + xx ** 2) / 8.0)
    clean /= clean.sum()
    blurred = np.fft.irfft2(np.fft.rfft2(clean) * gaussian_mtf(px, 1.2), s=(px, px))
    rng = np.random.default_rng(1)
    counts = rng.poisson(electrons * clean, (2000, px, px)) / electrons
    seen = counts.copy()
    for pattern in seen:   # each pattern a sample of its own: its own total kept
        apply_camera(pattern[None], electrons, CameraDraw(1.2, 0.0, 0), rng)
    np.testing.assert_allclose(seen.sum(axis=(1, 2)), counts.sum(axis=(1, 2)), rtol=1e-9)
    sd = seen.std(axis=0, ddof=1) / np.sqrt(len(seen))
    z = (seen.mean(axis=0) - blurred) / np.maximum(sd, 1e-12)
    assert np.abs(z).max() < 6
    assert np.abs(blurred - clean).max() > 20 * sd.max(), "the blur is resolved by the test"


def test_the_same_seed_draws_the_same_patterns_and_another_seed_others(store, counts_view):
    """The seed fixes the cameras (and, on the host and the streaming device path, their read noise; the
    resident set draws that from its batch's generator): the same seed the same patterns, another others."""
    spread = CAMERA.model_copy(update={"psf_sigma_px": (0.5, 2.0)})
    epochs = range(2)
    for path in (_host, _streaming_device, _resident):
        a, b = (path(store, counts_view, _data_cfg(spread), 1, epochs) for _ in range(2))
        np.testing.assert_array_equal(a, b)
        other = path(store, counts_view, _data_cfg(spread.model_copy(update={"seed": 6})), 1, epochs)
        assert not np.array_equal(a, other)


def test_the_clip_leaves_no_negative_value_on_any_path(store):
    """Untransformed (no minimum shift), read noise far above the signal: nothing delivered is below 0."""
    loud = _data_cfg(CAMERA.model_copy(update={"read_noise_e": (50.0, 50.0)}))
    host = _host(store, None, loud, 2, range(3))
    device = _streaming_device(store, None, loud, 2, range(3))
    assert host.min() == 0.0 and device.min() == 0.0, "read noise that large is clipped somewhere"
    raw = stage.DataConfig(num_workers=0, pin_memory=False, dose_augmentation=NOISY,
                           camera_augmentation=loud.camera_augmentation)
    ds = stage.SampleDataset(store, "train", None, raw_cbed=True)
    scale = ds.storage_scale
    none = stage.Normalizer("none", 0.0, 1.0, stage.Normalizer.fit(store, "log1p").targets, intensity_scale=scale)
    assert _resident(store, none, raw, 2, range(3)).min() >= 0.0


# ------------------------------------------------------------------ the config's refusals, one line each

@pytest.mark.parametrize("overrides, says", [
    (["data.camera_augmentation.enabled=true"],
     "data.camera_augmentation records the Poisson electrons of data.dose_augmentation"),
    (["data.dose_augmentation.enabled=true", "data.camera_augmentation.psf_sigma_px=[2, 1]"],
     "data.camera_augmentation.psf_sigma_px: psf_sigma_px [2.0, 1.0] must be [low, high] model pattern pixels"),
    (["data.dose_augmentation.enabled=true", "data.camera_augmentation.read_noise_e=[-0.5, 1]"],
     "data.camera_augmentation.read_noise_e: read_noise_e [-0.5, 1.0] must be [low, high] electrons per pixel"),
    (["data.camera_augmentation.integrating_fraction=1.5"],
     "data.camera_augmentation.integrating_fraction: integrating_fraction 1.5 is a probability"),
])
def test_a_config_the_camera_cannot_mean_is_refused_in_one_line(overrides, says):
    from pathlib import Path

    from workflow.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(Path(__file__).resolve().parents[1] / "configs" / "micro.yaml", overrides)
    text = str(info.value)
    assert "\n" not in text and says in text, text
    assert isinstance(info.value, UserError)


# ------------------------------------------------------------------ a real run records it

@pytest.mark.usefixtures("one_thread")
def test_a_training_run_with_the_camera_completes_and_its_published_card_records_it(tiny_data_dir, tiny_sim_config,
                                                                                    tmp_path):
    from evaluation import EvaluationConfig, evaluate
    from workflow.config import PipelineConfig, dump_config
    from workflow.pretrained import publish

    camera = CameraAugmentationConfig(enabled=True, integrating_fraction=0.5, seed=2)
    data = DATA_CFG.model_copy(update={"dose_augmentation": DoseAugmentationConfig(enabled=True),
                                       "camera_augmentation": camera})
    run = tmp_path / "run"
    result = models.train(models.ModelConfig(preset="tiny"), tiny_train_cfg(max_steps=4, eval_every=4,
                                                                              checkpoint_every=4),
                          None, data, [tiny_data_dir], tmp_path / "train", simulation=tiny_sim_config)
    assert result.steps == 4 and np.isfinite(result.final_dev_loss)
    shutil.copytree(result.model_dir, run / "model")
    evaluate(EvaluationConfig(n_bootstrap=20, n_panels=1, worst_k=1), data, [tiny_data_dir], run / "model",
             run / "eval")
    cfg = PipelineConfig(simulation=tiny_sim_config, model={"preset": "tiny", "in_channels": 64}, data=data)
    (run / "config.resolved.yaml").write_text(dump_config(cfg))
    card = models.load_reconstructor(publish(run, "camera-test", tmp_path / "pub"), device="cpu").card
    assert card.trained_on.camera_augmentation == camera
    assert card.data_config.camera_augmentation == camera
