"""`models.train`: the training loop over stage's dataset, with exact resume.

Output directory layout (``out_dir``, e.g. ``runs/<name>/``):

    train_run.json          identity of the run (architecture, training config, data manifest hash)
    checkpoints/step-*/     checkpoints (see models.checkpoint); the last ``keep_last`` and the best
    metrics.csv             one row per logged / evaluated step
    logs/tensorboard/       the same scalars for TensorBoard
    model/                  the exported reconstructor: model.safetensors + model_card.json

Each step: forward under autocast through ``engine.module``, Huber loss (+ L2 term) scaled for
fp16, backward, ``engine.synchronize()`` (averaged gradients), unscale, Inf/NaN check (skip and
count; stop after ``max_nonfinite`` in a row), LARC on the reduced gradients, optimiser step.
A skipped step still consumes its batch and advances the step counter.

Exact resume: the data order is a pure function of (seed, epoch) and the position inside the
epoch is restored by skipping consumed batches without reading them; model, optimiser, loss scale,
schedule positions and every RNG (torch, numpy, python; per rank) come back from the checkpoint.
On CPU an interrupted-and-resumed run ends with bit-identical weights to an uninterrupted one.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from namsa.errors import UserError

from . import checkpoint as ckpt
from .amp import LossScaler, autocast, grads_finite
from .config import Architecture, ModelConfig, TrainConfig
from .fcdensenet import build_model, count_parameters
from .flops import fcdensenet_conv_ops, step_flops
from .losses import huber_loss, l2_penalty
from .optim import BlockOptimizer
from .schedules import LRSchedule, huber_delta

RUN_FILE = "train_run.json"
METRICS_FILE = "metrics.csv"
MODEL_DIR = "model"
CARD_FILE = "model_card.json"
#: training fields that may change between a run and its resume (they do not change the result).
RESUMABLE_CHANGES = {"max_steps", "epochs", "eval_every", "checkpoint_every", "keep_last", "log_every",
                     "progress", "tensorboard", "max_dev_batches", "activation_checkpointing"}
METRIC_COLUMNS = ("step", "epoch", "train_loss", "l2_loss", "lr", "huber_delta", "loss_scale", "skipped_steps",
                  "samples_per_s", "step_s", "compute_s", "comm_s", "comm_total_s", "other_s", "tflops_step",
                  "tflops_sustained", "tflops_peak", "trust_min", "trust_max", "dev_loss", "dev_huber", "wall_s")
TARGET_UNITS = {"potential": "V*Angstrom", "density": "electrons/Angstrom^2"}


class TrainingError(UserError):
    """Training cannot start or continue (bad data, config, output dir, or diverged loss)."""


class DataShapeError(TrainingError):
    """The data's shapes do not fit the model."""


class NonFiniteLossError(TrainingError):
    """Too many Inf/NaN losses or gradients in a row."""


class OutputDirError(TrainingError):
    """The output directory holds another run."""


class CheckpointMismatchError(TrainingError):
    """A checkpoint written for another model configuration."""


@dataclass
class TrainResult:
    """What `train` produced; paths are absolute."""

    model_dir: Path
    best_checkpoint: Path | None
    metrics_csv: Path
    steps: int
    final_dev_loss: float | None


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


@dataclass
class _Timing:
    """Running FLOP-rate statistics of this process (eq. 3)."""

    ops_forward_per_sample: int = 0
    total_ops: float = 0.0
    total_s: float = 0.0
    peak_tflops: float = 0.0
    steps: int = 0


def train(model_cfg: ModelConfig | None, train_cfg: TrainConfig | None, dist_cfg: Any, data_cfg: Any,
          data_dirs: Any, out_dir: str | os.PathLike, resume: bool = False) -> TrainResult:
    """Train the reconstructor on the ``train`` split of the stores under ``data_dirs``.

    model_cfg / train_cfg: `ModelConfig` / `TrainConfig` (None = defaults); dist_cfg: a
    `models.distributed.DistributedConfig` or None (single process); data_cfg: `stage.DataConfig`
    (normalisation transform, loader knobs; None = defaults). ``resume=True`` continues the run in
    ``out_dir`` from its newest intact checkpoint (or starts it if there is none).
    """
    trainer = Trainer(model_cfg or ModelConfig(), train_cfg or TrainConfig(), dist_cfg, data_cfg, data_dirs,
                      Path(out_dir), resume)
    try:
        return trainer.fit()
    finally:
        trainer.close()


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    random.seed(seed)


def _data_dir_list(data_dirs: Any) -> list[Path]:
    if isinstance(data_dirs, (str, os.PathLike)):
        data_dirs = [data_dirs]
    return [Path(d) for d in data_dirs]


def manifest_hash(manifests: list[dict[str, Any]]) -> str:
    """sha256 of what defines the data: sample ids and splits, shapes, physics config hashes."""
    keys = ("config_hash", "arrays", "samples", "split_fractions", "split_seed", "count")
    payload = [{k: m.get(k) for k in keys} for m in manifests]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def code_version() -> str:
    """Installed package version plus the git commit of the source tree when there is one.

    (models may not import the namsa physics package, so the version comes from the metadata.)
    """
    import subprocess
    from importlib import metadata

    try:
        version = metadata.version("namsa")
    except metadata.PackageNotFoundError:
        version = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{version}+{commit}" if commit else version


class Trainer:
    """One training run; see the module docstring. Built by `train`."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, dist_cfg: Any, data_cfg: Any,
                 data_dirs: Any, out: Path, resume: bool):
        import stage
        from models.distributed import DistributedConfig, init_from_env

        self.model_cfg, self.cfg = model_cfg, train_cfg
        self.arch: Architecture = model_cfg.architecture()
        self.data_cfg = data_cfg if data_cfg is not None else stage.DataConfig()
        self.dist_cfg = dist_cfg if dist_cfg is not None else DistributedConfig()
        self.out = out.resolve()
        self.ckpt_dir = self.out / "checkpoints"
        self.engine = None
        self.tb = None
        self.bar = None
        self.ctx = init_from_env(self.dist_cfg)
        try:
            self.device = self._pick_device()
            self._open_data(data_dirs)
            self._check_data_shapes()
            if self.dev_total == 0:  # said after the checks, so bad data gets one line only
                self.ctx.notice("no dev samples: no dev-set evaluation; the final weights are exported")
            self.identity = self._identity()
            self._claim_out_dir(resume)
            self._build_model()
            self._build_loaders()
            if resume:
                self._restore()
        except BaseException:
            self.close()
            raise
        self.total_steps = train_cfg.max_steps or train_cfg.epochs * len(self.train_loader)

    # ------------------------------------------------------------------ setup

    def _pick_device(self) -> torch.device:
        want = self.cfg.device
        if want == "cuda" and not torch.cuda.is_available():
            raise TrainingError("training.device=cuda but torch sees no CUDA GPU; use device: auto or cpu")
        if want == "cpu":
            return torch.device("cpu")
        if want == "cuda" and self.ctx.device.type != "cuda":
            return torch.device("cuda", self.ctx.local_rank % torch.cuda.device_count())
        return self.ctx.device

    def _build_model(self) -> None:
        from models.distributed import build_engine

        cfg = self.cfg
        _seed_everything(cfg.seed)  # identical initial weights on every rank
        self.model = build_model(self.arch).to(self.device)
        if cfg.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.set_activation_checkpointing(cfg.activation_checkpointing)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.engine = build_engine(self.dist_cfg, self.model, self.ctx)
        self.forward = torch.compile(self.engine.module) if cfg.compile else self.engine.module
        self.optimizer = BlockOptimizer(self.model.blocks(), cfg)
        self.scaler = LossScaler(cfg.precision == "fp16", cfg.loss_scale_init, cfg.loss_scale_floor,
                                 cfg.loss_scale_growth_interval)
        self.lr_schedule = LRSchedule(cfg.lr0, self.ctx.world_size, cfg.warmup_steps, cfg.decay_every,
                                      cfg.decay_factor)
        self.pos = Position()
        self.timing = _Timing(ops_forward_per_sample=fcdensenet_conv_ops(self.model, self.cbed_shape))
        # per-rank dropout streams, reproducible from the seed
        _seed_everything(cfg.seed + 1_000_003 * (self.ctx.rank + 1))

    def _build_loaders(self) -> None:
        import stage

        cfg, ctx = self.cfg, self.ctx
        mode = "local" if self.local_data else None  # None: data.shard_mode
        self.train_loader = stage.make_loader(self.train_ds, self.data_cfg, cfg.batch_size, ctx.rank, ctx.world_size,
                                              shuffle=True, seed=cfg.seed, shard_mode=mode,
                                              samples_per_rank=self.train_per_rank)
        self.dev_loader = (stage.make_loader(self.dev_ds, self.data_cfg, cfg.batch_size, ctx.rank, ctx.world_size,
                                             shuffle=False, shard_mode=mode) if self.dev_ds is not None else None)

    def _open_data(self, data_dirs: Any) -> None:
        import stage

        dirs = _data_dir_list(data_dirs)
        paths: list[Path] = []
        for d in dirs:
            if not Path(d).exists():
                raise TrainingError(f"data directory {d} does not exist; run `namsa simulate` first or fix --data")
            paths += stage.find_stores(d)
        if not paths:
            raise TrainingError(f"no sample stores under {[str(d) for d in dirs]}; run `namsa simulate` or fix --data")
        self.store_paths = paths
        with stage.open_stores(paths) as stores:
            self.data_hash = manifest_hash(stores.manifests)
        self.normalizer = stage.Normalizer.fit(paths, self.data_cfg.transform)
        self.local_data = bool(self.data_cfg.node_local_dir)
        read_paths = self._stage_locally(dirs) if self.local_data else paths
        # On a GPU the loader ships float16 cbed as stored (half the host-to-device bytes) and the
        # input transform runs on the device; on the CPU it runs in the loader.
        raw = self.device.type == "cuda"
        targets = tuple(self.model_cfg.targets)
        self.train_ds = self._dataset(read_paths, "train", targets, raw, allow_empty=self.local_data)
        self.dev_ds = self._dataset(read_paths, "dev", targets, raw, allow_empty=True)
        self._agree_sample_counts()

    def _stage_locally(self, dirs: list[Path]) -> list[Path]:
        """``data.node_local_dir``: copy this rank's shard of the data there (verified; what is
        already staged is kept) and read only that, as in the paper's node-local staging."""
        import stage

        if self.data_cfg.shard_mode == "shared":
            raise TrainingError("data.shard_mode=shared has every rank read every store, which node-local staging "
                                "(data.node_local_dir) rules out; use shard_mode: unique or unset node_local_dir")
        ctx = self.ctx
        report = stage.stage_rank_shard(dirs, self.data_cfg.node_local_dir, self.data_hash, rank=ctx.rank,
                                        world_size=ctx.world_size, threads=max(1, self.data_cfg.num_workers))
        ctx.notice(f"staged rank {ctx.rank}'s shard of {ctx.world_size} into {self.data_cfg.node_local_dir}: "
                   f"{report.copied} samples copied ({report.bytes_copied / 1e9:.3f} GB in {report.seconds:.1f} s), "
                   f"{report.skipped} already there")
        return report.destinations

    def _dataset(self, paths: list[Path], split: str, targets: tuple[str, ...], raw: bool, allow_empty: bool) -> Any:
        """The split's `stage.SampleDataset`, or None when it has no samples and ``allow_empty``."""
        import stage
        from stage import EmptyStoreError

        cap = self.cfg.max_train_samples if split == "train" else None
        if cap is not None and self.local_data:
            cap = max(1, cap // self.ctx.world_size)  # the cap is global: each rank holds 1/P of the data
        try:
            return stage.SampleDataset(paths, split, self.normalizer, targets, raw_cbed=raw, max_samples=cap)
        except EmptyStoreError:
            if allow_empty:
                return None
            raise

    def _agree_sample_counts(self) -> None:
        """Sample totals, and with per-rank staged data the training samples every rank uses per
        epoch: the smallest rank's count, so every rank runs the same number of steps."""
        from models.distributed.launch import all_gather_objects

        mine = (len(self.train_ds) if self.train_ds is not None else 0, len(self.dev_ds) if self.dev_ds is not None else 0)
        counts = all_gather_objects(self.ctx, mine) if self.local_data and self.ctx.world_size > 1 else [mine]
        self.train_total, self.dev_total = (sum(c[i] for c in counts) for i in (0, 1))
        self.train_per_rank = min(c[0] for c in counts) if self.local_data else None
        if self.local_data and self.train_per_rank < self.cfg.batch_size:
            raise TrainingError(f"the ranks' staged shards hold {[c[0] for c in counts]} training samples; the smallest "
                                f"gives no full batch of {self.cfg.batch_size}: use fewer ranks, a smaller batch_size "
                                "or more data")

    def _check_data_shapes(self) -> None:
        s, p, p2 = self.train_ds.cbed_shape
        c, t, t2 = self.train_ds.target_shape
        problem = (self.arch.data_mismatch(s, p, t) if p == p2 and t == t2
                   else f"patterns {p}x{p2} or targets {t}x{t2} are not square")
        if problem:
            raise DataShapeError(f"{problem} (model preset {self.model_cfg.preset})")
        self.cbed_shape = (s, p, p2)

    def _identity(self) -> dict[str, Any]:
        return {"architecture": self.arch.to_dict(), "targets": list(self.model_cfg.targets),
                "train": self.cfg.model_dump(mode="json", exclude=RESUMABLE_CHANGES),
                "data_manifest_hash": self.data_hash, "world_size": self.ctx.world_size}

    def _claim_out_dir(self, resume: bool) -> None:
        run_file = self.out / RUN_FILE
        if run_file.exists():
            try:
                existing = json.loads(run_file.read_text())
            except ValueError:
                existing = {}
            if not resume:
                raise OutputDirError(f"{self.out} already holds a training run ({RUN_FILE}); pass --resume to "
                                     f"continue it or choose another --out")
            diff = _differences(existing.get("identity", {}), self.identity)
            if diff:
                raise OutputDirError(f"{self.out} holds a run with another configuration (differs in: "
                                     f"{', '.join(diff[:6])}); resume with the same config or choose another --out")
        elif resume and ckpt.list_checkpoints(self.ckpt_dir):
            raise OutputDirError(f"{self.out} has checkpoints but no {RUN_FILE}; it is not a namsa training run")
        self.ctx.barrier()
        if self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            if not run_file.exists():
                ckpt.write_json_atomic(run_file, {"identity": self.identity, "created": time.time()})
        self.ctx.barrier()

    def _restore(self) -> None:
        loaded = ckpt.load_latest(self.ckpt_dir, warn=self.ctx.notice)
        if loaded is None:
            self._start_clean()
            return
        path, model_state, opt_state, state = loaded
        if state.get("architecture") != self.arch.to_dict() or state.get("targets") != list(self.model_cfg.targets):
            diff = _differences({"architecture": state.get("architecture"), "targets": state.get("targets")},
                                {"architecture": self.arch.to_dict(), "targets": list(self.model_cfg.targets)})
            raise CheckpointMismatchError(f"checkpoint {path} was written for another model configuration "
                                          f"(differs in: {', '.join(diff[:6])}); use the model config it was "
                                          f"trained with or train into a new --out")
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(opt_state)
        self.scaler.load_state_dict(state["loss_scaler"])
        self.pos = Position(**state["position"])
        rngs = state["rng"]
        if len(rngs) == self.ctx.world_size:
            ckpt.set_rng_state(rngs[self.ctx.rank])
        else:
            self.ctx.notice(f"checkpoint {path.name} has RNG states of {len(rngs)} ranks, this job has "
                            f"{self.ctx.world_size}: the dropout streams restart (not an exact continuation)")
        self.ctx.notice(f"resumed from {path.name} (step {self.pos.step}, epoch {self.pos.epoch})")
        self._set_aside([p for p in ckpt.list_checkpoints(self.ckpt_dir) if p.name > path.name])
        self._truncate_metrics(self.pos.step)

    def _start_clean(self) -> None:
        """--resume with no usable checkpoint: step 0, with every damaged one moved aside (they
        would shadow the steps this run writes again, and be picked as the newest on export)."""
        damaged = ckpt.list_checkpoints(self.ckpt_dir)
        aside = self._set_aside(damaged)
        why = f"all {len(damaged)} checkpoints were damaged (moved to {aside})" if damaged else "no checkpoint"
        self.ctx.notice(f"--resume: {why} in {self.ckpt_dir}; starting from step 0")
        self._truncate_metrics(0)

    def _set_aside(self, damaged: list[Path]) -> Path | None:
        """Rank 0 moves ``damaged`` checkpoints out of the way (newer than the one resumed from, or
        all of them); returns where they went."""
        aside = None
        if damaged and self.ctx.is_main:
            aside = ckpt.set_aside(self.ckpt_dir, damaged)
        self.ctx.barrier()
        return aside

    # ------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        self._open_logs()
        start = time.perf_counter() - self.pos.wall_s
        loader = self.train_loader
        while self.pos.step < self.total_steps:
            loader.set_epoch(self.pos.epoch)
            loader.skip_batches(self.pos.batch_in_epoch)
            # worker seeds come from this generator, not from the global RNG that dropout uses
            loader.generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.pos.epoch)
            t_prev = time.perf_counter()
            for batch in loader:
                t_data = time.perf_counter()
                row = self._train_step(batch)
                row["epoch"] = self.pos.epoch  # the epoch this step belongs to (0-based)
                self.pos.step += 1
                self.pos.batch_in_epoch += 1
                self.pos.samples_seen += self.cfg.batch_size * self.ctx.world_size
                if self.pos.batch_in_epoch >= len(loader):
                    self.pos.epoch, self.pos.batch_in_epoch = self.pos.epoch + 1, 0
                self.pos.wall_s = time.perf_counter() - start
                self._account(row, t_prev, t_data)
                self._after_step(row)
                t_prev = time.perf_counter()
                if self.pos.step >= self.total_steps:
                    break
        return self._finish()

    def _train_step(self, batch: dict[str, Any]) -> dict[str, Any]:
        cfg, pos = self.cfg, self.pos
        x, y = self._to_device(batch)
        delta = huber_delta(pos.epoch, cfg.huber_delta0, cfg.huber_decay)
        lr = self.lr_schedule(pos.step)
        t0 = self._now()
        with autocast(cfg.precision, self.device):
            pred = self.forward(x)
        data_loss = huber_loss(pred, y, delta)
        loss = data_loss
        l2 = torch.zeros((), device=self.device)
        if self.optimizer.l2_in_loss and cfg.weight_decay > 0:
            l2 = l2_penalty(self.params, cfg.weight_decay)
            loss = loss + l2
        self.optimizer.zero_grad()
        self.scaler.scale_loss(loss).backward()
        t_sync = self._now()
        apply = self.engine.synchronize()
        comm_s = self._now() - t_sync  # exposed communication: the time synchronize() blocked
        stats = self.engine.stats()
        comm_total_s = float(stats.get("communication_s", 0.0)) + float(stats.get("coordination_s", 0.0))
        self.scaler.unscale_(self.params)
        losses = self._reduce_mean(torch.stack([data_loss.detach().float(), l2.detach().float()]))
        finite = grads_finite(self.params) and bool(torch.isfinite(losses).all())
        trust: list[float] = []
        if self.scaler.update(finite):
            pos.nonfinite_in_row = 0
            if apply:
                trust = self.optimizer.step(lr)
        else:
            self._on_nonfinite(lr, delta)
        compute_s = self._now() - t0 - comm_s
        pos.last_train_loss = float(losses[0])
        return {"train_loss": float(losses[0]), "l2_loss": float(losses[1]), "lr": lr, "huber_delta": delta,
                "loss_scale": self.scaler.scale, "compute_s": compute_s, "comm_s": comm_s,
                "comm_total_s": comm_total_s,
                "trust_min": min(trust) if trust else None, "trust_max": max(trust) if trust else None}

    def _to_device(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(normalised cbed, standardised targets) on the training device."""
        from stage.dataset import batch_to_device

        batch = batch_to_device(batch, self.device, self.normalizer)
        x = batch["cbed"]
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, batch["target"].float()

    def _on_nonfinite(self, lr: float, delta: float) -> None:
        pos = self.pos
        pos.skipped_steps += 1
        self.optimizer.zero_grad()
        # fp16 overflow above the floor is the loss scaler doing its job, not divergence
        if self.scaler.at_floor:
            pos.nonfinite_in_row += 1
        if pos.nonfinite_in_row >= self.cfg.max_nonfinite:
            raise NonFiniteLossError(
                f"training stopped at step {pos.step}: {pos.nonfinite_in_row} non-finite losses or gradients in a "
                f"row (lr {lr:.3g}, huber delta {delta:.3g}, precision {self.cfg.precision}); lower training.lr0, "
                f"use precision fp32 or bf16, or check the data for NaN/Inf (namsa inspect DIR --verify)")

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _reduce_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Average a small tensor over ranks (identity with one rank)."""
        if self.ctx.world_size == 1:
            return values
        if self.ctx.backend == "horovod":
            import horovod.torch as hvd

            return hvd.allreduce(values, op=hvd.Average)
        import torch.distributed as dist

        out = values.to(self.ctx.device, copy=True)  # NCCL reduces only CUDA tensors
        dist.all_reduce(out)
        return (out / self.ctx.world_size).to(values.device)

    def _account(self, row: dict[str, Any], t_prev: float, t_data: float) -> None:
        """Eq. 3: this step's and the running sustained/peak TFLOP/s of this device."""
        step_s = time.perf_counter() - t_prev
        flops = step_flops(self.timing.ops_forward_per_sample, self.cfg.batch_size, step_s,
                           comm_s=row["comm_s"], compute_s=row["compute_s"])
        t = self.timing
        t.steps += 1
        if t.steps > 1:  # this process's first step (allocation, compilation) is not sustained work
            t.total_ops += flops.ops_per_step
            t.total_s += step_s
            t.peak_tflops = max(t.peak_tflops, flops.sustained_tflops)
        row.update(step_s=step_s, other_s=flops.other_s, tflops_step=flops.sustained_tflops,
                   tflops_sustained=t.total_ops / t.total_s / 1e12 if t.total_s > 0 else None,
                   tflops_peak=t.peak_tflops or None,
                   samples_per_s=self.cfg.batch_size * self.ctx.world_size / step_s if step_s > 0 else None)

    def _after_step(self, row: dict[str, Any]) -> None:
        cfg, step = self.cfg, self.pos.step
        is_last = step >= self.total_steps
        row.update(step=step, skipped_steps=self.pos.skipped_steps, wall_s=self.pos.wall_s)
        evaluated = False
        if self.dev_total and (step % cfg.eval_every == 0 or is_last):
            row.update(self._evaluate())
            evaluated = True
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['train_loss']:.4g}", lr=f"{row['lr']:.3g}",
                                 delta=f"{row['huber_delta']:.3g}", sps=f"{row['samples_per_s'] or 0:.3g}")
        if step % cfg.log_every == 0 or evaluated or is_last:
            self._log(row)
        new_best = evaluated and self._note_dev(row["dev_loss"])
        if step % cfg.checkpoint_every == 0 or is_last or new_best:
            self._save_checkpoint()

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def _evaluate(self) -> dict[str, float]:
        """Dev-set MSE (the selection metric) and Huber loss, on standardised targets, of the
        model rank 0 exports: every rank takes rank 0's buffers (batch-norm statistics), then runs
        the bare model over its dev batches, so ranks may hold different numbers of dev batches
        (staged shards; none at all) and only the final sums are reduced."""
        from models.distributed.engines import broadcast_from_rank0

        broadcast_from_rank0(list(self.model.buffers()), self.ctx)
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        delta = huber_delta(self.pos.epoch, self.cfg.huber_delta0, self.cfg.huber_decay)
        if self.dev_loader is not None:
            self.dev_loader.generator = torch.Generator().manual_seed(self.cfg.seed)
        for b, batch in enumerate(self.dev_loader or ()):
            if self.cfg.max_dev_batches is not None and b >= self.cfg.max_dev_batches:
                break
            x, y = self._to_device(batch)
            with autocast(self.cfg.precision, self.device):
                pred = self.model(x).float()
            n = y.numel()
            sums += torch.tensor([float((pred - y).pow(2).sum()), float(huber_loss(pred, y, delta)) * n, n],
                                 dtype=torch.float64)
        self.model.train()
        sums = self._reduce_mean(sums) * self.ctx.world_size
        count = max(float(sums[2]), 1.0)
        return {"dev_loss": float(sums[0]) / count, "dev_huber": float(sums[1]) / count}

    def _note_dev(self, dev_loss: float) -> bool:
        pos = self.pos
        pos.last_dev_loss = dev_loss
        if math.isfinite(dev_loss) and (pos.best_dev_loss is None or dev_loss < pos.best_dev_loss):
            pos.best_dev_loss, pos.best_step = dev_loss, pos.step
            return True
        return False

    # ------------------------------------------------------------------ checkpoints and export

    def _save_checkpoint(self) -> None:
        """Rank 0 writes (atomically), every rank waits; RNG states of all ranks are kept."""
        from models.distributed.launch import all_gather_objects

        rngs = all_gather_objects(self.ctx, ckpt.rng_state()) if self.ctx.world_size > 1 else [ckpt.rng_state()]
        if self.ctx.is_main:
            last = ckpt.list_checkpoints(self.ckpt_dir)
            if not (last and last[-1].name == ckpt.step_dir_name(self.pos.step)):
                ckpt.save_checkpoint(self.ckpt_dir, self.pos.step, self.model.state_dict(),
                                     self.optimizer.state_dict(), self._state_json(rngs))
            keep = {ckpt.step_dir_name(self.pos.best_step)} if self.pos.best_step is not None else set()
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.keep_last, keep)
        self.ctx.barrier()

    def _state_json(self, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"architecture": self.arch.to_dict(), "targets": list(self.model_cfg.targets),
                "model_config": self.model_cfg.model_dump(mode="json"),
                "train_config": self.cfg.model_dump(mode="json"),
                "position": asdict(self.pos), "loss_scaler": self.scaler.state_dict(),
                "schedule": {"lr": self.lr_schedule(self.pos.step),
                             "huber_delta": huber_delta(self.pos.epoch, self.cfg.huber_delta0, self.cfg.huber_decay)},
                "data_position": {"epoch": self.pos.epoch, "batch_in_epoch": self.pos.batch_in_epoch,
                                  "seed": self.cfg.seed, "world_size": self.ctx.world_size},
                "rng": rngs, "normalizer": self.normalizer.to_dict(), "data_manifest_hash": self.data_hash,
                "world_size": self.ctx.world_size, "code_version": code_version()}

    def _finish(self) -> TrainResult:
        self._save_checkpoint()
        best = self.ckpt_dir / ckpt.step_dir_name(self.pos.best_step if self.pos.best_step is not None
                                                   else self.pos.step)
        if self.ctx.is_main:
            export_model(best, self.out / MODEL_DIR, self._card_extra(best))
        self.ctx.barrier()
        return TrainResult(model_dir=self.out / MODEL_DIR, best_checkpoint=best, metrics_csv=self.out / METRICS_FILE,
                           steps=self.pos.step, final_dev_loss=self.pos.last_dev_loss)

    def _card_extra(self, source: Path) -> dict[str, Any]:
        pos = self.pos
        return {"metrics": {"best_dev_loss": pos.best_dev_loss, "best_step": pos.best_step,
                            "final_dev_loss": pos.last_dev_loss, "final_train_loss": pos.last_train_loss,
                            "dev_loss_definition": "mean squared error on standardised targets"},
                "metrics_csv": str(self.out / METRICS_FILE),
                "training": {"steps": pos.step, "epochs_completed": pos.epoch, **self._length_facts(),
                             "samples_seen": pos.samples_seen,
                             "skipped_steps": pos.skipped_steps, "wall_s": pos.wall_s,
                             "world_size": self.ctx.world_size, "optimizer": self.cfg.optimizer,
                             "precision": self.cfg.precision, "batch_size_per_rank": self.cfg.batch_size,
                             "exported": "best" if pos.best_step is not None else "final",
                             "checkpoint": source.name, "sustained_tflops": (self.timing.total_ops /
                             self.timing.total_s / 1e12 if self.timing.total_s else None),
                             "peak_tflops": self.timing.peak_tflops or None},
                "data": {"dirs": [str(p) for p in self.store_paths], "train_samples": self.train_total,
                         "dev_samples": self.dev_total, "node_local_dir": self.data_cfg.node_local_dir,
                         "input_shape": list(self.cbed_shape)},
                "parameters": count_parameters(self.model),
                "forward_conv_ops_per_sample": self.timing.ops_forward_per_sample}

    def _length_facts(self) -> dict[str, Any]:
        """What bounded training: ``max_steps`` (wins when set) or ``epochs``, in words and numbers,
        so a card's ``train_config.epochs`` is not read as the epochs actually run."""
        cfg, per_epoch, steps = self.cfg, len(self.train_loader), self.pos.step
        bound = "max_steps" if cfg.max_steps else "epochs"
        if cfg.max_steps:
            text = (f"max_steps={cfg.max_steps} set the length (it wins over epochs={cfg.epochs}, which was not used): "
                    f"{steps} steps of {per_epoch} per epoch = {steps / per_epoch:.1f} epochs")
        else:
            text = f"epochs={cfg.epochs} set the length (max_steps unset): {cfg.epochs} x {per_epoch} steps"
        if steps < self.total_steps:
            text += f"; stopped at step {steps} of {self.total_steps}"
        return {"length_bound_by": bound, "steps_planned": self.total_steps, "steps_per_epoch": per_epoch,
                "length": text}

    # ------------------------------------------------------------------ logs

    def _open_logs(self) -> None:
        if not self.ctx.is_main:
            return
        if self.cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total_steps, initial=self.pos.step, desc="train", unit="step",
                            dynamic_ncols=True)
        if self.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.out / "logs" / "tensorboard"), purge_step=self.pos.step + 1)
        path = self.out / METRICS_FILE
        if not path.exists():
            with open(path, "w", newline="") as fh:
                csv.writer(fh).writerow(METRIC_COLUMNS)

    def _log(self, row: dict[str, Any]) -> None:
        if not self.ctx.is_main:
            return
        with open(self.out / METRICS_FILE, "a", newline="") as fh:
            csv.writer(fh).writerow(["" if row.get(c) is None else row.get(c) for c in METRIC_COLUMNS])
        if self.tb is not None:
            for name in METRIC_COLUMNS[2:]:
                if isinstance(row.get(name), (int, float)):
                    self.tb.add_scalar(f"train/{name}" if not name.startswith("dev") else f"dev/{name}",
                                       row[name], row["step"])

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric rows logged after the checkpoint we resume from (they will be redone)."""
        path = self.out / METRICS_FILE
        if not self.ctx.is_main or not path.exists():
            return
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        kept = rows[:1] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= step]
        tmp = path.with_name(f".tmp-{path.name}")
        with open(tmp, "w", newline="") as fh:
            csv.writer(fh).writerows(kept)
        os.replace(tmp, path)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.engine is not None:
            self.engine.close()


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "value"]


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
    ckpt.write_json_atomic(tmp / CARD_FILE, card)
    if model_dir.exists():
        trash = model_dir.with_name(f".tmp-old-{model_dir.name}.{os.getpid()}")
        os.replace(model_dir, trash)
        os.replace(tmp, model_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, model_dir)
    return model_dir


__all__ = ["train", "TrainResult", "Trainer", "TrainingError", "DataShapeError", "NonFiniteLossError",
           "OutputDirError", "CheckpointMismatchError", "export_model", "manifest_hash"]
