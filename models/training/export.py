"""Exporting a trained model: ``<out>/model/`` (model.safetensors + the model card) from a
checkpoint, and the card's facts about the run (metrics, training length, data)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stage.jsonfile import write_json_atomic

from .. import checkpoint as ckpt
from ..card import CARD_FILE
from ..fcdensenet import count_parameters
from .logs import METRICS_FILE

if TYPE_CHECKING:
    from .loop import Trainer

MODEL_DIR = "model"
TARGET_UNITS = {"potential": "V*Angstrom", "density": "electrons/Angstrom^2"}


def card_extra(t: Trainer, source: Path) -> dict[str, Any]:
    pos = t.pos
    return {"metrics": {"best_dev_loss": pos.best_dev_loss, "best_step": pos.best_step,
                        "final_dev_loss": pos.last_dev_loss, "final_train_loss": pos.last_train_loss,
                        "dev_loss_definition": "mean squared error on standardised targets"},
            "metrics_csv": str(t.out / METRICS_FILE),
            "training": {"steps": pos.step, "epochs_completed": pos.epoch, **_length_facts(t),
                         "samples_seen": pos.samples_seen,
                         "skipped_steps": pos.skipped_steps, "wall_s": pos.wall_s,
                         "world_size": t.ctx.world_size, "optimizer": t.cfg.optimizer,
                         "gradient_engine": t.engine.name if t.ctx.world_size > 1 else "none",
                         "precision": t.cfg.precision, "batch_size_per_rank": t.cfg.batch_size,
                         "exported": "best" if pos.best_step is not None else "final",
                         "checkpoint": source.name, "sustained_tflops": (t.timing.total_ops /
                         t.timing.total_s / 1e12 if t.timing.total_s else None),
                         "peak_tflops": t.timing.peak_tflops or None},
            "data": {"dirs": [str(p) for p in t.data.store_paths], "train_samples": t.data.train_total,
                     "dev_samples": t.data.dev_total, "node_local_dir": t.data_cfg.node_local_dir,
                     "input_shape": list(t.data.cbed_shape)},
            "parameters": count_parameters(t.model),
            "forward_conv_ops_per_sample": t.timing.ops_forward_per_sample}


def _length_facts(t: Trainer) -> dict[str, Any]:
    """What bounded training: ``max_steps`` (wins when set) or ``epochs``, in words and numbers,
    so a card's ``train_config.epochs`` is not read as the epochs actually run."""
    cfg, per_epoch, steps = t.cfg, len(t.train_loader), t.pos.step
    bound = "max_steps" if cfg.max_steps else "epochs"
    if cfg.max_steps:
        text = (f"max_steps={cfg.max_steps} set the length (it wins over epochs={cfg.epochs}, which was not used): "
                f"{steps} steps of {per_epoch} per epoch = {steps / per_epoch:.1f} epochs")
    else:
        text = f"epochs={cfg.epochs} set the length (max_steps unset): {cfg.epochs} x {per_epoch} steps"
    if steps < t.total_steps:
        text += f"; stopped at step {steps} of {t.total_steps}"
    return {"length_bound_by": bound, "steps_planned": t.total_steps, "steps_per_epoch": per_epoch,
            "length": text}


def resolved_model_config(model_config: dict[str, Any], architecture: dict[str, Any]) -> dict[str, Any]:
    """The model config as a card shows it: every field the preset decides (null in the config,
    meaning "the preset's value") written out from the resolved architecture, and ``overrides``
    naming the fields the config set itself. ``td_channels`` stays null when each transition down
    keeps its input width (that is its resolved value)."""
    out = {k: (architecture[k] if v is None and k in architecture else v) for k, v in model_config.items()}
    out["overrides"] = sorted(k for k, v in model_config.items() if v is not None and k in architecture)
    return out


def export_model(checkpoint_dir: Path, model_dir: Path, extra: dict[str, Any]) -> Path:
    """Write ``model_dir`` (model.safetensors + model_card.json) from a checkpoint, atomically."""
    state = ckpt.verify_checkpoint(checkpoint_dir)
    tmp = model_dir.with_name(f".tmp-{model_dir.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(checkpoint_dir / ckpt.MODEL_FILE, tmp / ckpt.MODEL_FILE)
    card = {"format": "namsa-reconstructor", "format_version": ckpt.FORMAT_VERSION,
            "model_config": resolved_model_config(state["model_config"], state["architecture"]),
            "architecture": state["architecture"],
            "targets": state["targets"], "target_units": {t: TARGET_UNITS[t] for t in state["targets"]},
            "normalizer": state["normalizer"], "data_manifest_hash": state["data_manifest_hash"],
            "code_version": state["code_version"], "train_config": state["train_config"],
            "files": {ckpt.MODEL_FILE: state["files"][ckpt.MODEL_FILE]}, **extra}
    write_json_atomic(tmp / CARD_FILE, card, sort_keys=True)
    if model_dir.exists():
        trash = model_dir.with_name(f".tmp-old-{model_dir.name}.{os.getpid()}")
        os.replace(model_dir, trash)
        os.replace(tmp, model_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, model_dir)
    return model_dir


__all__ = ["MODEL_DIR", "TARGET_UNITS", "card_extra", "resolved_model_config", "export_model"]
