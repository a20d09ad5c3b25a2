"""The run directory: claiming ``out_dir`` (``train_run.json``), checkpoints with the state JSON,
and exact resume from the newest intact checkpoint (damaged or newer ones set aside).

Exact resume: the data order is a pure function of (seed, epoch) and the position inside the
epoch is restored by skipping consumed batches without reading them; model, optimiser, loss scale,
schedule positions and every RNG (torch, numpy, python; per rank) come back from the checkpoint.
On CPU an interrupted-and-resumed run ends with bit-identical weights to an uninterrupted one.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stage.jsonfile import write_json_atomic
from stage.manifest import code_version

from .. import checkpoint as ckpt
from ..schedules import huber_delta
from .errors import CheckpointMismatchError, OutputDirError

if TYPE_CHECKING:
    from .loop import Trainer

RUN_FILE = "train_run.json"
#: training fields that may change between a run and its resume (they do not change the result).
RESUMABLE_CHANGES = {"max_steps", "epochs", "eval_every", "checkpoint_every", "keep_last", "log_every",
                     "progress", "tensorboard", "max_dev_batches", "activation_checkpointing"}


@dataclass
class Position:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    samples_seen: int = 0
    nonfinite_in_row: int = 0
    skipped_steps: int = 0
    best_dev_loss: float | None = None
    best_step: int | None = None
    last_dev_loss: float | None = None
    last_train_loss: float | None = None
    wall_s: float = 0.0


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "value"]


def identity(t: Trainer) -> dict[str, Any]:
    """What a resume must match: architecture, targets, training config, data hash, world size."""
    return {"architecture": t.arch.to_dict(), "targets": list(t.model_cfg.targets),
            "train": t.cfg.model_dump(mode="json", exclude=RESUMABLE_CHANGES),
            "data_manifest_hash": t.data.data_hash, "world_size": t.ctx.world_size}


def claim_out_dir(t: Trainer, resume: bool) -> None:
    run_file = t.out / RUN_FILE
    if run_file.exists():
        try:
            existing = json.loads(run_file.read_text())
        except ValueError:
            existing = {}
        if not resume:
            raise OutputDirError(f"{t.out} already holds a training run ({RUN_FILE}); pass --resume to "
                                 f"continue it or choose another --out")
        diff = _differences(existing.get("identity", {}), t.identity)
        if diff:
            raise OutputDirError(f"{t.out} holds a run with another configuration (differs in: "
                                 f"{', '.join(diff[:6])}); resume with the same config or choose another --out")
    elif resume and ckpt.list_checkpoints(t.ckpt_dir):
        raise OutputDirError(f"{t.out} has checkpoints but no {RUN_FILE}; it is not a namsa training run")
    t.ctx.barrier()
    if t.ctx.is_main:
        t.out.mkdir(parents=True, exist_ok=True)
        if not run_file.exists():
            write_json_atomic(run_file, {"identity": t.identity, "created": time.time()}, sort_keys=True)
    t.ctx.barrier()


def restore(t: Trainer) -> None:
    loaded = ckpt.load_latest(t.ckpt_dir, warn=t.ctx.notice)
    if loaded is None:
        _start_clean(t)
        return
    path, model_state, opt_state, state = loaded
    if state.get("architecture") != t.arch.to_dict() or state.get("targets") != list(t.model_cfg.targets):
        diff = _differences({"architecture": state.get("architecture"), "targets": state.get("targets")},
                            {"architecture": t.arch.to_dict(), "targets": list(t.model_cfg.targets)})
        raise CheckpointMismatchError(f"checkpoint {path} was written for another model configuration "
                                      f"(differs in: {', '.join(diff[:6])}); use the model config it was "
                                      f"trained with or train into a new --out")
    t.model.load_state_dict(model_state)
    t.optimizer.load_state_dict(opt_state)
    t.scaler.load_state_dict(state["loss_scaler"])
    t.pos = Position(**state["position"])
    rngs = state["rng"]
    if len(rngs) == t.ctx.world_size:
        ckpt.set_rng_state(rngs[t.ctx.rank], t.device)
    else:
        t.ctx.notice(f"checkpoint {path.name} has RNG states of {len(rngs)} ranks, this job has "
                     f"{t.ctx.world_size}: the dropout streams restart (not an exact continuation)")
    t.ctx.notice(f"resumed from {path.name} (step {t.pos.step}, epoch {t.pos.epoch})")
    _set_aside(t, [p for p in ckpt.list_checkpoints(t.ckpt_dir) if p.name > path.name])
    t.logs.truncate(t.pos.step)


def _start_clean(t: Trainer) -> None:
    """--resume with no usable checkpoint: step 0, with every damaged one moved aside (they
    would shadow the steps this run writes again, and be picked as the newest on export)."""
    damaged = ckpt.list_checkpoints(t.ckpt_dir)
    aside = _set_aside(t, damaged)
    why = f"all {len(damaged)} checkpoints were damaged (moved to {aside})" if damaged else "no checkpoint"
    t.ctx.notice(f"--resume: {why} in {t.ckpt_dir}; starting from step 0")
    t.logs.truncate(0)


def _set_aside(t: Trainer, damaged: list[Path]) -> Path | None:
    """Rank 0 moves ``damaged`` checkpoints out of the way (newer than the one resumed from, or
    all of them); returns where they went."""
    aside = None
    if damaged and t.ctx.is_main:
        aside = ckpt.set_aside(t.ckpt_dir, damaged)
    t.ctx.barrier()
    return aside


def save_checkpoint(t: Trainer) -> None:
    """Rank 0 writes (atomically), every rank waits; RNG states of all ranks are kept."""
    from models.distributed.launch import all_gather_objects

    own = ckpt.rng_state(t.device)  # this rank's CUDA generator only, whatever else the node has
    rngs = all_gather_objects(t.ctx, own) if t.ctx.world_size > 1 else [own]
    if t.ctx.is_main:
        last = ckpt.list_checkpoints(t.ckpt_dir)
        if not (last and last[-1].name == ckpt.step_dir_name(t.pos.step)):
            ckpt.save_checkpoint(t.ckpt_dir, t.pos.step, t.model.state_dict(),
                                 t.optimizer.state_dict(), _state_json(t, rngs))
        keep = {ckpt.step_dir_name(t.pos.best_step)} if t.pos.best_step is not None else set()
        ckpt.prune_checkpoints(t.ckpt_dir, t.cfg.keep_last, keep)
    t.ctx.barrier()


def _state_json(t: Trainer, rngs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"architecture": t.arch.to_dict(), "targets": list(t.model_cfg.targets),
            "model_config": t.model_cfg.model_dump(mode="json"),
            "train_config": t.cfg.model_dump(mode="json"),
            "position": asdict(t.pos), "loss_scaler": t.scaler.state_dict(),
            "schedule": {"lr": t.lr_schedule(t.pos.step),
                         "huber_delta": huber_delta(t.pos.epoch, t.cfg.huber_delta0, t.cfg.huber_decay)},
            "data_position": {"epoch": t.pos.epoch, "batch_in_epoch": t.pos.batch_in_epoch,
                              "seed": t.cfg.seed, "world_size": t.ctx.world_size},
            "rng": rngs, "normalizer": t.data.normalizer.to_dict(), "data_manifest_hash": t.data.data_hash,
            "world_size": t.ctx.world_size, "code_version": code_version()}


__all__ = ["RUN_FILE", "RESUMABLE_CHANGES", "Position", "identity", "claim_out_dir", "restore",
           "save_checkpoint"]
