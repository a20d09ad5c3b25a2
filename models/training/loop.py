"""The Trainer: setup (device, model, engine, optimiser), the loop with its mixed-precision step,
dev evaluation, and the end of a run (last checkpoint and export); `train` runs one.

Each step: forward under autocast through ``engine.module``, Huber loss (+ L2 term) scaled for
fp16, backward, ``engine.synchronize()`` (averaged gradients), unscale, Inf/NaN check (skip and
count; stop after ``max_nonfinite`` in a row), LARC on the reduced gradients, optimiser step.
A skipped step still consumes its batch and advances the step counter.
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from namsa.config import SimulationConfig
from namsa.random_streams import TrainingStream, training_seed

from ..amp import LossScaler, autocast, grads_finite
from ..config import Architecture, ModelConfig, TrainConfig
from ..fcdensenet import build_model
from ..flops import fcdensenet_conv_ops
from ..losses import huber_loss, l2_penalty
from ..optim import BlockOptimizer
from ..schedules import LRSchedule, huber_delta
from .data import TrainingData
from .errors import NonFiniteLossError, TrainingError
from .export import MODEL_DIR, card_extra, expected_input, export_model
from .init_weights import InitialModel
from .logs import METRICS_FILE, MetricsLog, Timing
from .run_state import Position, RunState


@dataclass
class TrainResult:
    """What `train` produced; paths are absolute."""

    model_dir: Path
    best_checkpoint: Path | None
    metrics_csv: Path
    steps: int
    final_dev_loss: float | None
    #: what ended training: ``length`` (max_steps or epochs) or ``max_wall_s`` (the wall-clock limit)
    stopped_by: str = "length"


def train(model_cfg: ModelConfig | None, train_cfg: TrainConfig | None, dist_cfg: Any, data_cfg: Any,
          data_dirs: Any, out_dir: str | os.PathLike, resume: bool = False,
          simulation: SimulationConfig | None = None) -> TrainResult:
    """Train the reconstructor on the ``train`` split of the stores under ``data_dirs``.

    model_cfg / train_cfg: `ModelConfig` / `TrainConfig` (None = defaults); dist_cfg: a
    `models.distributed.DistributedConfig` or None (single process); data_cfg: `stage.DataConfig`
    (normalisation transform, loader knobs; None = defaults). ``resume=True`` continues the run in
    ``out_dir`` from its newest intact checkpoint (or starts it if there is none). ``simulation``:
    the `namsa.SimulationConfig` the stores were simulated with; the exported card records the input
    it expects from it (`export.expected_input`), when the stores' config hashes say they are its.
    """
    trainer = Trainer(model_cfg or ModelConfig(), train_cfg or TrainConfig(), dist_cfg, data_cfg, data_dirs,
                      Path(out_dir), resume, simulation)
    try:
        return trainer.fit()
    finally:
        trainer.close()


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    random.seed(seed)


def _check_precision_with_lag(cfg: TrainConfig, dist_cfg: Any) -> None:
    """fp16 and gradient lag are refused together: the lagged gradient was scaled by the previous
    step's loss scale, so after every scale change (an overflow halves it, growth doubles it) the
    step would unscale it with the wrong factor and apply a gradient 2x too large or too small."""
    if cfg.precision == "fp16" and getattr(dist_cfg, "gradient_lag", False):
        raise TrainingError("training.precision=fp16 cannot be combined with distributed.gradient_lag (the lagged "
                            "gradient would be unscaled with a later loss scale); use precision bf16 or fp32, or "
                            "set distributed.gradient_lag: false")


class Trainer:
    """One training run; see the module docstring. Built by `train`. Its data, logs, saved state
    and export live in the sibling modules (`TrainingData`, `MetricsLog`, `RunState`, `export`)."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, dist_cfg: Any, data_cfg: Any,
                 data_dirs: Any, out: Path, resume: bool, simulation: SimulationConfig | None = None):
        import stage
        from models.distributed import DistributedConfig, init_from_env

        self.model_cfg, self.cfg = model_cfg, train_cfg
        self.arch: Architecture = model_cfg.architecture()
        self.data_cfg = data_cfg if data_cfg is not None else stage.DataConfig()
        self.dist_cfg = dist_cfg if dist_cfg is not None else DistributedConfig()
        _check_precision_with_lag(train_cfg, self.dist_cfg)
        self.out = out.resolve()
        self.engine = None
        self.ctx = init_from_env(self.dist_cfg)
        self.logs = MetricsLog(self.out, self.ctx)
        try:
            self.device = self._pick_device()
            #: the model this run starts from (training.init_from): its weights and normaliser
            self.initial = (InitialModel(train_cfg.init_from, self.arch, model_cfg.targets, self.data_cfg.transform)
                            if train_cfg.init_from else None)
            self.data = TrainingData(model_cfg, train_cfg, self.arch, self.data_cfg, self.ctx, self.device,
                                     data_dirs, normalizer=self.initial.normalizer if self.initial else None)
            if self.data.dev_total == 0:  # said after the checks, so bad data gets one line only
                self.ctx.notice("no dev samples: no dev-set evaluation; the final weights are exported")
            self.expects_input = expected_input(simulation, self.data)
            if simulation is not None and self.expects_input is None:
                self.ctx.notice("the stores were not simulated with this config's simulation section (their config "
                                "hash differs): the exported card records no expects_input, so namsa reconstruct "
                                "cannot fit a scan to it")
            self.run_state = RunState(self.out, self.ctx, self.arch, model_cfg, train_cfg, self.data.normalizer,
                                      self.data.data_hash)
            self.run_state.claim(resume)
            self._build_model()
            self.train_loader, self.dev_loader = self.data.build_loaders()
            if resume:
                self.pos = self.run_state.restore(self.model, self.optimizer, self.scaler, self.device)
                self.logs.truncate(self.pos.step)
        except BaseException:
            self.close()
            raise
        self.total_steps = train_cfg.max_steps or train_cfg.epochs * len(self.train_loader)
        #: training.max_wall_s ended the run (agreed by every rank), not max_steps / epochs
        self.stopped_by_wall = False

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
        _seed_everything(cfg.seed)  # identical initial weights on every rank: the run's main stream
        self.model = build_model(self.arch).to(self.device)
        if self.model.icom_residual is not None:  # start from iCoM's physical amplitude (a resume loads its own)
            norm = self.data.normalizer
            self.model.icom_residual.init_gain(norm.physics_stats["icom"][1], norm.targets["potential"][1])
        if self.initial is not None:  # fine-tuning: every rank starts from the same trained weights
            self.model.load_state_dict(self.initial.state)
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
        self.timing = Timing(ops_forward_per_sample=fcdensenet_conv_ops(self.model, self.data.cbed_shape))
        # per-rank dropout streams, reproducible from the seed
        _seed_everything(training_seed(cfg.seed, TrainingStream.DROPOUT, 0, self.ctx.rank, self.ctx.world_size))

    # ------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        self.logs.open(self.cfg, self.total_steps, self.pos.step)
        start = time.perf_counter() - self.pos.wall_s
        self.fit_started = time.perf_counter()  # training.max_wall_s counts this process's time only
        loader = self.train_loader
        while self.pos.step < self.total_steps and not self.stopped_by_wall:
            loader.set_epoch(self.pos.epoch)
            loader.skip_batches(self.pos.batch_in_epoch)
            # worker seeds come from this generator, not from the global RNG that dropout uses
            loader.generator = torch.Generator().manual_seed(
                training_seed(self.cfg.seed, TrainingStream.LOADER_WORKERS, self.pos.epoch))
            t_prev = time.perf_counter()
            for batch in loader:
                row = self._train_step(batch)
                row["epoch"] = self.pos.epoch  # the epoch this step belongs to (0-based)
                self.pos.step += 1
                self.pos.batch_in_epoch += 1
                self.pos.samples_seen += self.cfg.batch_size * self.ctx.world_size
                if self.pos.batch_in_epoch >= len(loader):
                    self.pos.epoch, self.pos.batch_in_epoch = self.pos.epoch + 1, 0
                self.pos.wall_s = time.perf_counter() - start
                self.timing.account(row, t_prev, self.cfg.batch_size, self.ctx.world_size)
                # the last planned step ends the run anyway (every rank holds the same step count)
                self.stopped_by_wall = self.pos.step < self.total_steps and self._wall_limit_reached()
                self._after_step(row)
                t_prev = time.perf_counter()
                if self.pos.step >= self.total_steps or self.stopped_by_wall:
                    break
        if self.stopped_by_wall:
            self.ctx.notice(f"training.max_wall_s={self.cfg.max_wall_s:g} s reached: stopped at step {self.pos.step} "
                            f"of {self.total_steps}")
        return self._finish()

    def _wall_limit_reached(self) -> bool:
        """Whether training.max_wall_s has passed since `fit` began, agreed by every rank: each
        rank's clock differs, so one rank past the limit stops all of them at this step (the mean
        of the 0/1 flags is > 0 when any is 1: an all-reduce MAX); no collective without a limit."""
        if self.cfg.max_wall_s is None:
            return False
        late = float(time.perf_counter() - self.fit_started >= self.cfg.max_wall_s)
        return bool(self._reduce_mean(torch.tensor([late]))[0] > 0)

    def _train_step(self, batch: dict[str, Any]) -> dict[str, Any]:
        cfg, pos = self.cfg, self.pos
        x, y = self.data.to_device(batch, train=True)
        delta = huber_delta(pos.epoch, cfg.huber_delta0, cfg.huber_decay)
        lr = self.lr_schedule(pos.step)
        t0 = self._now()
        with autocast(cfg.precision, self.device):
            pred = self.forward(x)
        data_loss = self.data.data_loss(pred, y, delta)  # training.loss_weighting
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
        with self.ctx.collective("averaging over ranks"):
            if self.ctx.backend == "horovod":
                import horovod.torch as hvd

                return hvd.allreduce(values, op=hvd.Average)
            import torch.distributed as dist

            out = values.to(self.ctx.device, copy=True)  # NCCL reduces only CUDA tensors
            dist.all_reduce(out)
            return (out / self.ctx.world_size).to(values.device)

    def _after_step(self, row: dict[str, Any]) -> None:
        cfg, step = self.cfg, self.pos.step
        is_last = step >= self.total_steps or self.stopped_by_wall
        row.update(step=step, skipped_steps=self.pos.skipped_steps, wall_s=self.pos.wall_s)
        evaluated = False
        if self.data.dev_total and (step % cfg.eval_every == 0 or is_last):
            row.update(self._evaluate())
            evaluated = True
        self.logs.progress(row)
        if step % cfg.log_every == 0 or evaluated or is_last:
            self.logs.log(row)
        new_best = evaluated and self._note_dev(row["dev_loss"])
        if step % cfg.checkpoint_every == 0 or is_last or new_best:
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        self.run_state.save(self.pos, self.model, self.optimizer, self.scaler, self.device,
                            self.lr_schedule(self.pos.step))

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
            dev_seed = training_seed(self.cfg.seed, TrainingStream.DEV_LOADER)
            self.dev_loader.generator = torch.Generator().manual_seed(dev_seed)
        for b, batch in enumerate(self.dev_loader or ()):
            if self.cfg.max_dev_batches is not None and b >= self.cfg.max_dev_batches:
                break
            x, y = self.data.to_device(batch)
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

    # ------------------------------------------------------------------ the end

    def _finish(self) -> TrainResult:
        self._save_checkpoint()
        pos = self.pos
        best = self.run_state.checkpoint(pos.best_step if pos.best_step is not None else pos.step)
        if self.ctx.is_main:
            engine = self.engine.name if self.ctx.world_size > 1 else "none"
            facts = card_extra(best, out=self.out, pos=pos, cfg=self.cfg, data=self.data, timing=self.timing,
                               model=self.model, world_size=self.ctx.world_size, engine_name=engine,
                               steps_per_epoch=len(self.train_loader), total_steps=self.total_steps,
                               stopped_by_wall=self.stopped_by_wall,
                               initialized_from=self.initial.facts if self.initial else None,
                               initial_lineage=self.initial.lineage if self.initial else None,
                               expects_input=self.expects_input)
            export_model(best, self.out / MODEL_DIR, facts, parent=self.initial.card if self.initial else None)
        self.ctx.barrier()
        return TrainResult(model_dir=self.out / MODEL_DIR, best_checkpoint=best, metrics_csv=self.out / METRICS_FILE,
                           steps=self.pos.step, final_dev_loss=self.pos.last_dev_loss,
                           stopped_by="max_wall_s" if self.stopped_by_wall else "length")

    def close(self) -> None:
        self.logs.close()
        for loader in (getattr(self, "train_loader", None), getattr(self, "dev_loader", None)):
            if hasattr(loader, "close"):   # reader threads, a resident set's background draws
                loader.close()
        if self.engine is not None:
            self.engine.close()


__all__ = ["train", "TrainResult", "Trainer"]
