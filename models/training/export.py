"""Exporting a trained model: ``<out>/model/`` (model.safetensors + the model card) from a
checkpoint, and the card's facts about the run (metrics, training length, data, the chain of runs
that made the weights: `run_lineage`, and the input it expects: `expected_input`)."""
from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from namsa.config import SimulationConfig
from stage import dir_swap

from .. import checkpoint as ckpt
from ..card import DataInfo, ExpectsInput, ModelCard
from ..card_training import InitialModelFacts, LineageLink, TrainingFacts, position_metrics, today_utc
from ..card_writer import card_from_state, write_card
from ..config import TrainConfig
from ..fcdensenet import count_parameters
from .data import TrainingData
from .logs import METRICS_FILE, Timing
from .run_state import Position

MODEL_DIR = "model"
TARGET_UNITS = {"potential": "V*Angstrom", "density": "electrons/Angstrom^2"}


def card_extra(source: Path, *, out: Path, pos: Position, cfg: TrainConfig, data: TrainingData,
               timing: Timing, model: torch.nn.Module, world_size: int, engine_name: str, steps_per_epoch: int,
               total_steps: int, stopped_by_wall: bool = False,
               initialized_from: InitialModelFacts | None = None,
               initial_lineage: list[LineageLink] | None = None,
               expects_input: ExpectsInput | None = None) -> dict[str, Any]:
    """The card's facts about the run that exported checkpoint ``source`` into ``out``, as its typed
    records: metrics (`position_metrics`), training length (`_length_facts`) and machine
    (`TrainingFacts`), data (`DataInfo`) and parameters; ``engine_name``: the gradient engine
    (``"none"`` with one rank); ``stopped_by_wall``: training.max_wall_s ended the run;
    ``initialized_from``: the model it was fine-tuned from (`InitialModel.facts`), recorded under
    ``training.initialized_from``, and its chain ``initial_lineage`` (`InitialModel.lineage`), which
    ``training.lineage`` continues (`run_lineage`);
    ``expects_input``: what the model expects of its input (`expected_input`), None to record nothing;
    times in seconds, rates in TFLOP/s."""
    origin = {"initialized_from": initialized_from} if initialized_from else {}
    expects = {"expects_input": expects_input} if expects_input is not None else {}
    device = device_name(model)
    this_run = LineageLink(weights_xxh3_128=exported_weights(source), train_samples=data.train_total,
                           steps=pos.step, samples_seen=pos.samples_seen, device=device, wall_s=pos.wall_s,
                           date=today_utc())
    training = TrainingFacts(steps=pos.step, epochs_completed=pos.epoch,
                             **_length_facts(cfg, pos.step, steps_per_epoch, total_steps, stopped_by_wall),
                             samples_seen=pos.samples_seen, skipped_steps=pos.skipped_steps, wall_s=pos.wall_s,
                             world_size=world_size, optimizer=cfg.optimizer, gradient_engine=engine_name,
                             precision=cfg.precision, batch_size_per_rank=cfg.batch_size,
                             exported="best" if pos.best_step is not None else "final", checkpoint=source.name,
                             sustained_tflops=timing.total_ops / timing.total_s / 1e12 if timing.total_s else None,
                             peak_tflops=timing.peak_tflops or None, device=device,
                             lineage=run_lineage(initial_lineage, this_run), **origin)
    stores = DataInfo(dirs=[str(p) for p in data.store_paths], train_samples=data.train_total,
                      dev_samples=data.dev_total, node_local_dir=data.data_cfg.node_local_dir,
                      input_shape=list(data.cbed_shape))
    return {"metrics": position_metrics(asdict(pos), "mean squared error on standardised targets"),
            "metrics_csv": str(out / METRICS_FILE), "training": training, "data": stores,
            "parameters": count_parameters(model),
            "forward_conv_ops_per_sample": timing.ops_forward_per_sample, **expects}


def run_lineage(initial_lineage: list[LineageLink] | None, this_run: LineageLink) -> list[LineageLink]:
    """The card's ``training.lineage``: the initial model's chain (`InitialModel.lineage`) and then
    ``this_run``; ``[this_run]`` for a run not fine-tuned."""
    return [*(initial_lineage or []), this_run]


def exported_weights(checkpoint_dir: Path) -> str:
    """The xxh3_128 of checkpoint ``checkpoint_dir``'s weights as the checkpoint recorded it when it
    wrote them (`models.checkpoint.file_digest`): the digest the exported card's ``files`` entry takes
    (`card_from_state`), which `export_model` checks against the file before the card is written."""
    info = (ckpt.read_state(checkpoint_dir).get("files") or {}).get(ckpt.MODEL_FILE)
    if not isinstance(info, dict) or not isinstance(info.get("xxh3_128"), str):
        raise ckpt.CorruptCheckpointError(f"checkpoint {checkpoint_dir}: its state records no digest of "
                                          f"{ckpt.MODEL_FILE}; it is damaged")
    return info["xxh3_128"]


def expected_input(simulation: SimulationConfig | None, data: TrainingData) -> ExpectsInput | None:
    """The card's ``expects_input``: the sampling of ``simulation``, the config the run was given
    (`ExpectsInput.of`), when every training store was simulated with it (each store's config hash is
    its `SimulationConfig.physics_hash`); None without a config or when the stores hold another
    config's samples: the card then claims nothing it cannot back."""
    if simulation is None or data.config_hashes != {simulation.physics_hash()}:
        return None
    return ExpectsInput.of(simulation)


def device_name(model: torch.nn.Module) -> str:
    """What the model was trained on, as its card says it: the GPU's name (``"NVIDIA H200"``) or ``"cpu"``."""
    device = next(model.parameters()).device
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _length_facts(cfg: TrainConfig, steps: int, per_epoch: int, total_steps: int,
                  stopped_by_wall: bool = False) -> dict[str, Any]:
    """What bounded training: ``max_steps`` (wins when set) or ``epochs``, in words and numbers,
    so a card's ``train_config.epochs`` is not read as the epochs actually run; ``stopped_by``
    is ``max_wall_s`` when the wall-clock limit ended the run first (at step ``steps``)."""
    bound = "max_steps" if cfg.max_steps else "epochs"
    if cfg.max_steps:
        text = (f"max_steps={cfg.max_steps} set the length (it wins over epochs={cfg.epochs}, which was not used): "
                f"{steps} steps of {per_epoch} per epoch = {steps / per_epoch:.1f} epochs")
    else:
        text = f"epochs={cfg.epochs} set the length (max_steps unset): {cfg.epochs} x {per_epoch} steps"
    if stopped_by_wall:
        text += f"; stopped at the wall-clock limit max_wall_s={cfg.max_wall_s:g} s at step {steps} of {total_steps}"
    elif steps < total_steps:
        text += f"; stopped at step {steps} of {total_steps}"
    return {"length_bound_by": bound, "steps_planned": total_steps, "steps_per_epoch": per_epoch,
            "stopped_by": "max_wall_s" if stopped_by_wall else bound, "length": text}


def resolved_model_config(model_config: dict[str, Any], architecture: dict[str, Any]) -> dict[str, Any]:
    """The model config as a card shows it: every field the preset decides (null in the config,
    meaning "the preset's value") written out from the resolved architecture, and ``overrides``
    naming the fields the config set itself. ``td_channels`` stays null when each transition down
    keeps its input width (that is its resolved value)."""
    out = {k: (architecture[k] if v is None and k in architecture else v) for k, v in model_config.items()}
    out["overrides"] = sorted(k for k, v in model_config.items() if v is not None and k in architecture)
    return out


def export_model(checkpoint_dir: Path, model_dir: Path, extra: dict[str, Any], parent: ModelCard | None = None) -> Path:
    """Write ``model_dir`` (model.safetensors + model_card.json) from a checkpoint, swapped into place
    whole (`stage.dir_swap`): a kill leaves the earlier export or this one. ``parent``: the card of the
    model a fine-tune started from (`InitialModel.card`), whose training statistics the card's join."""
    state = ckpt.verify_checkpoint(checkpoint_dir)
    dir_swap.recover(model_dir)
    tmp = dir_swap.temporary_sibling(model_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(checkpoint_dir / ckpt.MODEL_FILE, tmp / ckpt.MODEL_FILE)
    card = card_from_state(state, f"the card exported from {checkpoint_dir}", parent=parent,
                           model_config=resolved_model_config(state["model_config"], state["architecture"]),
                           target_units={t: TARGET_UNITS[t] for t in state["targets"]}, **extra)
    write_card(tmp, card)
    dir_swap.swap_into_place(tmp, model_dir)
    return model_dir


__all__ = ["MODEL_DIR", "TARGET_UNITS", "card_extra", "expected_input", "exported_weights", "resolved_model_config",
           "run_lineage", "export_model"]
