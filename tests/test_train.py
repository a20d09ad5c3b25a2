"""models.train on the lead's tiny real data set: overfitting, outputs, precision, and bad input."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import models
from _train_helpers import DATA_CFG, one_thread, read_metrics, tiny_train_cfg  # noqa: F401
from models import ModelConfig
from models.checkpoint import PickledCheckpointError
from models.training import CheckpointMismatchError, DataShapeError, NonFiniteLossError, OutputDirError
from models.training.loop import _seed_everything

pytestmark = pytest.mark.usefixtures("one_thread")
BASE_STEPS = 8


def _train(out: Path, data_dir: Path, model_cfg: ModelConfig | None = None, resume: bool = False, **train):
    return models.train(model_cfg or ModelConfig(preset="tiny"), tiny_train_cfg(**train), None, DATA_CFG,
                        [data_dir], out, resume=resume)


BASE = dict(max_steps=BASE_STEPS, eval_every=3, checkpoint_every=2, keep_last=2)


@pytest.fixture(scope="module")
def base_run(tiny_data_dir, tmp_path_factory):
    """One real 8-step LARC-Adam run with progress bar and TensorBoard on; tests copy it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("base") / "run"
    result = _train(out, tiny_data_dir, progress=True, tensorboard=True, **BASE)
    torch.set_num_threads(before)
    return result


def _copy_run(result, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(Path(result.model_dir).parent, dst)
    return dst


def test_tiny_model_overfits_a_handful_of_real_samples(tiny_data_dir, tmp_path):
    cfg = dict(max_steps=200, lr0=5e-3, max_train_samples=4, batch_size=4, eval_every=1000,
               checkpoint_every=1000, weight_decay=0.0, optimizer="adam")
    result = _train(tmp_path / "run", tiny_data_dir, **cfg)
    losses = [float(r["train_loss"]) for r in read_metrics(result.metrics_csv)]
    assert len(losses) == 200
    first, last = losses[0], max(losses[-10:])
    assert last < first / 10, (first, last)


def test_dose_augmentation_reaches_the_training_batches(tiny_data_dir, tmp_path):
    """data.dose_augmentation on: the same seeded run sees noisy training patterns (other losses),
    while the dev split stays as stored (the same dev loss at step 0 is not guaranteed, so only train)."""
    noisy_data = DATA_CFG.model_copy(update={"dose_augmentation": DATA_CFG.dose_augmentation.model_copy(
        update={"enabled": True, "dose_range_e_per_A2": (1e2, 1e2), "clean_fraction": 0.0})})
    steps = dict(max_steps=2, eval_every=1000, checkpoint_every=1000)
    clean = _train(tmp_path / "clean", tiny_data_dir, **steps)
    noisy = models.train(ModelConfig(preset="tiny"), tiny_train_cfg(**steps), None, noisy_data, [tiny_data_dir],
                         tmp_path / "noisy")
    clean_loss = [float(r["train_loss"]) for r in read_metrics(clean.metrics_csv)]
    noisy_loss = [float(r["train_loss"]) for r in read_metrics(noisy.metrics_csv)]
    assert len(clean_loss) == len(noisy_loss) == 2
    assert clean_loss[0] != noisy_loss[0]
    on_device = noisy_data.model_copy(update={"dose_augmentation": noisy_data.dose_augmentation.model_copy(
        update={"on_device": True})})
    device = models.train(ModelConfig(preset="tiny"), tiny_train_cfg(**steps), None, on_device, [tiny_data_dir],
                          tmp_path / "on_device")
    device_loss = [float(r["train_loss"]) for r in read_metrics(device.metrics_csv)]
    # the noise drawn in the training step: other counts than the loader's, still not the clean batch
    assert len(device_loss) == 2 and all(np.isfinite(device_loss)) and device_loss[0] != clean_loss[0]


def test_run_outputs(base_run):
    out = Path(base_run.model_dir).parent
    assert base_run.steps == BASE_STEPS
    rows = read_metrics(base_run.metrics_csv)
    assert [int(r["step"]) for r in rows] == list(range(1, BASE_STEPS + 1))
    assert all(float(r["samples_per_s"]) > 0 and float(r["tflops_step"]) > 0 for r in rows)
    # eq. 3: 3 x forward conv ops of the tiny model at 64 x 16 x 16 (9,172,992) x batch / step time
    for r in rows:
        assert float(r["tflops_step"]) == pytest.approx(3 * 9_172_992 * 2 / float(r["step_s"]) / 1e12, rel=1e-4)
        assert float(r["compute_s"]) + float(r["comm_s"]) + float(r["other_s"]) == pytest.approx(
            float(r["step_s"]), rel=1e-3, abs=1e-5)
    assert all(0 < float(r["trust_min"]) <= float(r["trust_max"]) <= 1 for r in rows)  # LARC clip mode
    evaluated = [int(r["step"]) for r in rows if r["dev_loss"]]
    assert evaluated == [3, 6, 8]
    assert base_run.final_dev_loss == pytest.approx(float(rows[-1]["dev_loss"]))
    assert list((out / "logs" / "tensorboard").glob("events.out.tfevents.*"))
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    best = base_run.best_checkpoint.name
    assert ckpts == sorted({"step-00000006", "step-00000008", best})
    card = models.load_reconstructor(base_run.model_dir).card
    assert card.training.checkpoint == best and card.targets == ["potential"]
    assert card.data_manifest_hash and card.normalizer.transform == DATA_CFG.transform
    assert card.metrics.best_dev_loss == min(float(r["dev_loss"]) for r in rows if r["dev_loss"])


def test_model_card_states_the_resolved_model_config_and_what_bounded_training(base_run):
    card = models.load_reconstructor(base_run.model_dir).card
    arch = card.architecture.model_dump()
    config = card.model_config_.model_dump(mode="json")
    # every preset-decided field written out from the architecture; null only where null is the value
    assert {k: v for k, v in config.items() if v is None} == ({"td_channels": None} if arch["td_channels"] is None
                                                               else {})
    for key in ("growth_rate", "levels", "layers_per_block", "kernel_size", "dropout", "in_channels"):
        assert config[key] == arch[key], key
    assert config["preset"] == "tiny" and config["overrides"] == []
    training = card.training
    assert training.length_bound_by == "max_steps" and training.steps_planned == BASE_STEPS
    assert training.stopped_by == "max_steps" and base_run.stopped_by == "length"
    assert training.length.startswith(f"max_steps={BASE_STEPS} set the length (it wins over epochs=")
    assert card.train_config.epochs > training.epochs_completed   # why the card must say which bound
    assert training.device == "cpu"   # what it was trained on (a GPU's own name there)


def test_model_card_says_when_epochs_bounded_training(tiny_data_dir, tmp_path):
    result = _train(tmp_path / "run", tiny_data_dir, ModelConfig(preset="tiny", growth_rate=3), max_steps=None,
                    epochs=1, eval_every=100, checkpoint_every=100)
    card = models.load_reconstructor(result.model_dir).card
    training = card.training
    assert training.length_bound_by == "epochs" and training.epochs_completed == 1
    assert training.steps == training.steps_planned == training.steps_per_epoch == result.steps
    assert training.length == f"epochs=1 set the length (max_steps unset): 1 x {result.steps} steps"
    assert card.model_config_.overrides == ["growth_rate"] and card.model_config_.growth_rate == 3


def test_wall_clock_limit_ends_the_run_as_max_steps_would(tiny_data_dir, tmp_path):
    """training.max_wall_s far below what max_steps needs: the run stops early, evaluates dev at
    its last step, exports the best checkpoint, and the card says why and where it stopped."""
    max_steps = 5000
    result = _train(tmp_path / "run", tiny_data_dir, max_steps=max_steps, max_wall_s=0.5, eval_every=1000,
                    checkpoint_every=1000)
    assert 0 < result.steps < max_steps and result.stopped_by == "max_wall_s"
    rows = read_metrics(result.metrics_csv)
    assert int(rows[-1]["step"]) == result.steps and rows[-1]["dev_loss"]  # the last step was evaluated
    reconstructor = models.load_reconstructor(result.model_dir)
    training = reconstructor.card.training
    assert training.stopped_by == "max_wall_s" and training.steps == result.steps
    assert f"wall-clock limit max_wall_s=0.5 s at step {result.steps} of {max_steps}" in training.length
    assert training.checkpoint == result.best_checkpoint.name
    assert reconstructor.card.metrics.final_dev_loss == pytest.approx(float(rows[-1]["dev_loss"]))


def test_resume_extends_a_finished_run(base_run, tmp_path, tiny_data_dir, capsys):
    out = _copy_run(base_run, tmp_path)
    result = _train(out, tiny_data_dir, resume=True, **{**BASE, "max_steps": BASE_STEPS + 2})
    assert result.steps == BASE_STEPS + 2
    assert "resumed from step-00000008" in capsys.readouterr().err
    assert [int(r["step"]) for r in read_metrics(result.metrics_csv)] == list(range(1, BASE_STEPS + 3))


def test_output_dir_holding_another_run_is_refused(base_run, tmp_path, tiny_data_dir):
    out = _copy_run(base_run, tmp_path)
    with pytest.raises(OutputDirError, match="--resume"):
        _train(out, tiny_data_dir, **BASE)
    with pytest.raises(OutputDirError, match="train.lr0"):
        _train(out, tiny_data_dir, resume=True, **{**BASE, "lr0": 5e-3})


def test_corrupt_checkpoint_falls_back_to_the_previous_one(base_run, tmp_path, tiny_data_dir, capsys):
    out = _copy_run(base_run, tmp_path)
    weights = out / "checkpoints" / "step-00000008" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated by a crash
    result = _train(out, tiny_data_dir, resume=True, **BASE)
    err = capsys.readouterr().err
    assert "truncated" in err and "falling back to step-00000006" in err
    assert result.steps == BASE_STEPS
    assert (out / "checkpoints" / "step-00000008" / "model.safetensors").stat().st_size > weights.stat().st_size // 2


def test_resume_with_every_checkpoint_damaged_starts_clean(base_run, tmp_path, tiny_data_dir, capsys):
    """No usable checkpoint: step 0, the damaged ones moved aside (not read again, not deleted)."""
    out = _copy_run(base_run, tmp_path)
    damaged = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    for name in damaged:
        weights = out / "checkpoints" / name / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    result = _train(out, tiny_data_dir, resume=True, **BASE)
    err = capsys.readouterr().err
    assert f"all {len(damaged)} checkpoints were damaged" in err and "starting from step 0" in err
    aside = list((out / "checkpoints").glob("damaged-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == damaged
    assert result.steps == BASE_STEPS
    assert [int(r["step"]) for r in read_metrics(result.metrics_csv)] == list(range(1, BASE_STEPS + 1))
    models.load_reconstructor(result.model_dir)  # the exported model is one of the new checkpoints


def test_pickled_checkpoint_is_refused_on_resume(base_run, tmp_path, tiny_data_dir):
    out = _copy_run(base_run, tmp_path)
    torch.save({"evil": torch.zeros(1)}, out / "checkpoints" / "step-00000008" / "optimizer.safetensors")
    with pytest.raises(PickledCheckpointError, match="pickled payload"):
        _train(out, tiny_data_dir, resume=True, **BASE)


def test_checkpoint_of_another_model_config_is_refused(base_run, tmp_path, tiny_data_dir):
    other = _train(tmp_path / "other", tiny_data_dir, ModelConfig(preset="tiny", growth_rate=4),
                   max_steps=2, checkpoint_every=2)
    out = _copy_run(base_run, tmp_path)
    shutil.copytree(other.best_checkpoint, out / "checkpoints" / "step-00000020")
    with pytest.raises(CheckpointMismatchError, match="growth_rate"):
        _train(out, tiny_data_dir, resume=True, **BASE)


def test_epochs_set_the_length_and_the_huber_delta_decays_per_epoch(tiny_data_dir, tmp_path):
    result = _train(tmp_path / "run", tiny_data_dir, max_steps=None, epochs=3, max_train_samples=4,
                    eval_every=100, checkpoint_every=100, huber_delta0=10.0, huber_decay=0.5)
    rows = read_metrics(result.metrics_csv)
    assert result.steps == 6  # 4 samples / batch 2 = 2 steps per epoch
    assert [float(r["huber_delta"]) for r in rows] == [10.0, 10.0, 5.0, 5.0, 2.5, 2.5]
    assert [int(r["epoch"]) for r in rows] == [0, 0, 1, 1, 2, 2]


def test_data_shape_mismatch_names_the_fix(tiny_data_dir, tmp_path):
    with pytest.raises(DataShapeError, match="model.in_channels=64"):
        _train(tmp_path / "a", tiny_data_dir, ModelConfig(preset="tiny", in_channels=1024))
    with pytest.raises(DataShapeError, match="multiple of 32"):
        _train(tmp_path / "b", tiny_data_dir, ModelConfig(preset="tiny", levels=5, layers_per_block=[1] * 11))


def test_diverging_loss_stops_with_a_clear_message(tiny_data_dir, tmp_path):
    with pytest.raises(NonFiniteLossError, match="non-finite losses or gradients in a row"):
        _train(tmp_path / "run", tiny_data_dir, optimizer="adam", lr0=1e30, max_nonfinite=2, max_steps=20)
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert int(rows[-1]["skipped_steps"]) >= 1


def test_fp16_forced_overflow_skips_the_step_and_halves_the_scale(tiny_data_dir, tmp_path):
    # a loss scale of 2^60 overflows float16 in the backward pass of every step
    result = _train(tmp_path / "run", tiny_data_dir, precision="fp16", loss_scale_init=2.0 ** 60, max_steps=3,
                    checkpoint_every=3, eval_every=100)
    rows = read_metrics(result.metrics_csv)
    assert [float(r["loss_scale"]) for r in rows] == [2.0 ** 59, 2.0 ** 58, 2.0 ** 57]
    assert [int(r["skipped_steps"]) for r in rows] == [1, 2, 3]
    _seed_everything(0)
    initial = dict(models.build_model(ModelConfig(preset="tiny")).named_parameters())
    trained = load_file(str(Path(result.model_dir) / "model.safetensors"))
    # no parameter moved (batch-norm running statistics, buffers, do follow every forward pass)
    assert all(torch.equal(p.detach(), trained[k]) for k, p in initial.items())


def test_fp16_with_gradient_lag_is_refused_before_anything_is_written(tiny_data_dir, tmp_path):
    from models.distributed import DistributedConfig
    from models.training.errors import TrainingError

    with pytest.raises(TrainingError, match="fp16 cannot be combined with distributed.gradient_lag"):
        models.train(ModelConfig(preset="tiny"), tiny_train_cfg(precision="fp16"), DistributedConfig(gradient_lag=True),
                     DATA_CFG, [tiny_data_dir], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_fp16_overflow_at_the_scale_floor_counts_as_divergence(tiny_data_dir, tmp_path):
    with pytest.raises(NonFiniteLossError, match="precision fp16"):
        _train(tmp_path / "run", tiny_data_dir, precision="fp16", loss_scale_init=2.0 ** 60,
               loss_scale_floor=2.0 ** 60, max_nonfinite=3, max_steps=10)
    assert [int(r["skipped_steps"]) for r in read_metrics(tmp_path / "run" / "metrics.csv")] == [1, 2]


@pytest.mark.parametrize("precision, optimizer, targets", [("bf16", "lamb", ["potential", "density"]),
                                                           ("fp32", "adamw", ["density"])])
def test_other_precisions_optimizers_and_targets_train(tiny_data_dir, tmp_path, precision, optimizer, targets):
    result = _train(tmp_path / "run", tiny_data_dir, ModelConfig(preset="tiny", targets=targets), precision=precision,
                    optimizer=optimizer, max_steps=4, eval_every=4, checkpoint_every=4)
    rows = read_metrics(result.metrics_csv)
    assert len(rows) == 4 and all(int(r["skipped_steps"]) == 0 for r in rows)
    assert all(torch.isfinite(v).all() for v in load_file(str(Path(result.model_dir) / "model.safetensors")).values())
    rec = models.load_reconstructor(result.model_dir, device="cpu")
    assert rec.targets == targets
    import stage

    with stage.open_stores(stage.find_stores(tiny_data_dir)) as stores:
        sample = stores[0]
    maps = rec.predict(sample.cbed)
    assert maps.shape == (len(targets), *sample.potential.shape)
    for channel, name in enumerate(targets):  # each channel on its own target's physical scale
        mean, std = rec.normalizer.targets[name]
        assert abs(float(maps[channel].mean()) - mean) < 5 * std


@pytest.mark.gpu
@pytest.mark.parametrize("compile_", [False, True])
def test_cuda_bf16_channels_last_training_and_prediction(tiny_data_dir, tmp_path, compile_):
    result = _train(tmp_path / "run", tiny_data_dir, device="cuda", precision="bf16", channels_last=True,
                    compile=compile_, max_steps=4, eval_every=4, checkpoint_every=4)
    rows = read_metrics(result.metrics_csv)
    assert len(rows) == 4 and all(int(r["skipped_steps"]) == 0 for r in rows)
    rec = models.load_reconstructor(result.model_dir)
    assert rec.device.type == "cuda"
    assert rec.card.training["device"] == torch.cuda.get_device_name(0)   # the card says which GPU
    import stage

    with stage.open_stores(stage.find_stores(tiny_data_dir)) as stores:
        sample = stores[0]
    assert rec.predict(sample.cbed).shape == (1, *sample.potential.shape)
