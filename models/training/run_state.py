"""The saved state of a training run in its output directory: claiming ``out_dir``
(``train_run.json``), checkpoints with the state JSON, and exact resume from the newest intact
checkpoint (damaged or newer ones set aside).

Exact resume: the data order is a pure function of (seed, epoch) and the position inside the
epoch is restored by skipping consumed batches without reading them; model, optimiser, loss scale,
schedule positions and every RNG (torch, numpy, python; per rank) come back from the checkpoint.
On CPU an interrupted-and-resumed run ends with bit-identical weights to an uninterrupted one.

`RunState` is given what it saves and restores (model, optimiser, loss scaler, `Position`); it
knows nothing of the loop that drives them.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from stage.jsonfile import write_json_atomic
from stage.manifest import code_version

from .. import checkpoint as ckpt
from ..amp import LossScaler
from ..config import Architecture, ModelConfig, TrainConfig
from ..optim import BlockOptimizer
from ..schedules import huber_delta
from .errors import CheckpointMismatchError, OutputDirError

RUN_FILE = "train_run.json"
CHECKPOINTS_DIR = "checkpoints"
#: training fields that may change between a run and its resume (they do not change the result).
RESUMABLE_CHANGES = {"max_steps", "max_wall_s", "epochs", "eval_every", "checkpoint_every", "keep_last",
                     "log_every", "progress", "tensorboard", "max_dev_batches", "activation_checkpointing"}


@dataclass
class Position:
    """Where training stands; saved in every checkpoint. ``wall_s``: seconds trained so far."""

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


def differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "value"]


class RunState:
    """The run directory ``out`` of one training run on the ranks of ``ctx``: what the run is
    (``identity``: what a resume must match) and its checkpoints under ``out/checkpoints``."""

    def __init__(self, out: Path, ctx: Any, arch: Architecture, model_cfg: ModelConfig, cfg: TrainConfig,
                 normalizer: Any, data_hash: str):
        self.out, self.ckpt_dir, self.ctx = out, out / CHECKPOINTS_DIR, ctx
        self.arch, self.model_cfg, self.cfg = arch, model_cfg, cfg
        self.normalizer, self.data_hash = normalizer, data_hash
        self.identity = {"architecture": arch.to_dict(), "targets": list(model_cfg.targets),
                         "train": cfg.model_dump(mode="json", exclude=RESUMABLE_CHANGES),
                         "data_manifest_hash": data_hash, "world_size": ctx.world_size}

    def checkpoint(self, step: int) -> Path:
        """The directory of the checkpoint of ``step``."""
        return self.ckpt_dir / ckpt.step_dir_name(step)

    def claim(self, resume: bool) -> None:
        """Make ``out`` this run's (``train_run.json``), or check that a resumed one is this run."""
        run_file = self.out / RUN_FILE
        if run_file.exists():
            self._check_existing(run_file, resume)
        elif resume and ckpt.list_checkpoints(self.ckpt_dir):
            raise OutputDirError(f"{self.out} has checkpoints but no {RUN_FILE}; it is not a namsa training run")
        self.ctx.barrier()
        if self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            if not run_file.exists():
                write_json_atomic(run_file, {"identity": self.identity, "created": time.time()}, sort_keys=True)
        self.ctx.barrier()

    def _check_existing(self, run_file: Path, resume: bool) -> None:
        try:
            existing = json.loads(run_file.read_text())
        except ValueError:
            existing = {}
        if not resume:
            raise OutputDirError(f"{self.out} already holds a training run ({RUN_FILE}); pass --resume to "
                                 f"continue it or choose another --out")
        diff = differences(existing.get("identity", {}), self.identity)
        if diff:
            raise OutputDirError(f"{self.out} holds a run with another configuration (differs in: "
                                 f"{', '.join(diff[:6])}); resume with the same config or choose another --out")

    def restore(self, model: torch.nn.Module, optimizer: BlockOptimizer, scaler: LossScaler,
                device: torch.device) -> Position:
        """Load the newest intact checkpoint into ``model``, ``optimizer``, ``scaler`` and this rank's
        RNGs; return its position (step 0 when there is none: damaged ones are set aside)."""
        if self.ctx.is_main:  # a swap a kill interrupted: its checkpoint back under its name
            ckpt.recover_checkpoints(self.ckpt_dir)
        self.ctx.barrier()
        loaded = ckpt.load_latest(self.ckpt_dir, warn=self.ctx.notice)
        if loaded is None:
            self._start_clean()
            return Position()
        path, model_state, opt_state, state = loaded
        mine = {"architecture": self.arch.to_dict(), "targets": list(self.model_cfg.targets)}
        theirs = {"architecture": _as_today(state.get("architecture")), "targets": state.get("targets")}
        if theirs != mine:
            diff = differences(theirs, mine)
            raise CheckpointMismatchError(f"checkpoint {path} was written for another model configuration "
                                          f"(differs in: {', '.join(diff[:6])}); use the model config it was "
                                          f"trained with or train into a new --out")
        model.load_state_dict(model_state)
        optimizer.load_state_dict(opt_state)
        scaler.load_state_dict(state["loss_scaler"])
        pos = Position(**state["position"])
        self._restore_rngs(state["rng"], path, device)
        self.ctx.notice(f"resumed from {path.name} (step {pos.step}, epoch {pos.epoch})")
        self._set_aside([p for p in ckpt.list_checkpoints(self.ckpt_dir) if p.name > path.name])
        return pos

    def _restore_rngs(self, rngs: list[dict[str, Any]], path: Path, device: torch.device) -> None:
        ctx = self.ctx
        if len(rngs) == ctx.world_size:
            ckpt.set_rng_state(rngs[ctx.rank], device)
        else:
            ctx.notice(f"checkpoint {path.name} has RNG states of {len(rngs)} ranks, this job has "
                       f"{ctx.world_size}: the dropout streams restart (not an exact continuation)")

    def _start_clean(self) -> None:
        """--resume with no usable checkpoint: step 0, with every damaged one moved aside (they
        would shadow the steps this run writes again, and be picked as the newest on export)."""
        damaged = ckpt.list_checkpoints(self.ckpt_dir)
        aside = self._set_aside(damaged)
        why = f"all {len(damaged)} checkpoints were damaged (moved to {aside})" if damaged else "no checkpoint"
        self.ctx.notice(f"--resume: {why} in {self.ckpt_dir}; starting from step 0")

    def _set_aside(self, damaged: list[Path]) -> Path | None:
        """Rank 0 moves ``damaged`` checkpoints out of the way (newer than the one resumed from, or
        all of them); returns where they went."""
        aside = None
        if damaged and self.ctx.is_main:
            aside = ckpt.set_aside(self.ckpt_dir, damaged)
        self.ctx.barrier()
        return aside

    def save(self, pos: Position, model: torch.nn.Module, optimizer: BlockOptimizer, scaler: LossScaler,
             device: torch.device, lr: float) -> None:
        """Checkpoint the run at ``pos`` (``lr``: the learning rate of that step): rank 0 writes
        (atomically), every rank waits; RNG states of all ranks are kept."""
        from models.distributed.launch import all_gather_objects

        ctx = self.ctx
        own = ckpt.rng_state(device)  # this rank's CUDA generator only, whatever else the node has
        rngs = all_gather_objects(ctx, own) if ctx.world_size > 1 else [own]
        if ctx.is_main:
            last = ckpt.list_checkpoints(self.ckpt_dir)
            if not (last and last[-1].name == ckpt.step_dir_name(pos.step)):
                ckpt.save_checkpoint(self.ckpt_dir, pos.step, model.state_dict(), optimizer.state_dict(),
                                     self._state_json(pos, scaler, lr, rngs))
            keep = {ckpt.step_dir_name(pos.best_step)} if pos.best_step is not None else set()
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.keep_last, keep)
        ctx.barrier()

    def _state_json(self, pos: Position, scaler: LossScaler, lr: float, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return {"architecture": self.arch.to_dict(), "targets": list(self.model_cfg.targets),
                "model_config": self.model_cfg.model_dump(mode="json"),
                "train_config": cfg.model_dump(mode="json"),
                "position": asdict(pos), "loss_scaler": scaler.state_dict(),
                "schedule": {"lr": lr, "huber_delta": huber_delta(pos.epoch, cfg.huber_delta0, cfg.huber_decay)},
                "data_position": {"epoch": pos.epoch, "batch_in_epoch": pos.batch_in_epoch,
                                  "seed": cfg.seed, "world_size": self.ctx.world_size},
                "rng": rngs, "normalizer": self.normalizer.to_dict(), "data_manifest_hash": self.data_hash,
                "world_size": self.ctx.world_size, "code_version": code_version()}


def _as_today(architecture: Any) -> Any:
    """A checkpoint's architecture with the keys added since it was written at their defaults
    (`Architecture.from_dict`), so a run started before a new key resumes when nothing changed."""
    if not isinstance(architecture, dict):
        return architecture
    try:
        return Architecture.from_dict(architecture).to_dict()
    except TypeError:  # keys this code does not know: compared as written, so the refusal names them
        return architecture


__all__ = ["RUN_FILE", "CHECKPOINTS_DIR", "RESUMABLE_CHANGES", "Position", "RunState", "differences"]
