"""What a run logs: ``metrics.csv``, TensorBoard scalars and the progress bar (rank 0 only),
and the timing and FLOP-rate accounting of each step (eq. 3)."""
from __future__ import annotations

import csv
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stage.nofollow import open_no_follow

from ..flops import step_flops

METRICS_FILE = "metrics.csv"
METRIC_COLUMNS = ("step", "epoch", "train_loss", "l2_loss", "lr", "huber_delta", "loss_scale", "skipped_steps",
                  "samples_per_s", "step_s", "compute_s", "comm_s", "comm_total_s", "other_s", "tflops_step",
                  "tflops_sustained", "tflops_peak", "trust_min", "trust_max", "dev_loss", "dev_huber", "wall_s")


@dataclass
class Timing:
    """Running FLOP-rate statistics of this process (eq. 3)."""

    ops_forward_per_sample: int = 0
    total_ops: float = 0.0
    total_s: float = 0.0
    peak_tflops: float = 0.0
    steps: int = 0

    def account(self, row: dict[str, Any], t_prev: float, batch_size: int, world_size: int) -> None:
        """Eq. 3: this step's and the running sustained/peak TFLOP/s of this device."""
        step_s = time.perf_counter() - t_prev
        flops = step_flops(self.ops_forward_per_sample, batch_size, step_s,
                           comm_s=row["comm_s"], compute_s=row["compute_s"])
        self.steps += 1
        if self.steps > 1:  # this process's first step (allocation, compilation) is not sustained work
            self.total_ops += flops.ops_per_step
            self.total_s += step_s
            self.peak_tflops = max(self.peak_tflops, flops.sustained_tflops)
        row.update(step_s=step_s, other_s=flops.other_s, tflops_step=flops.sustained_tflops,
                   tflops_sustained=self.total_ops / self.total_s / 1e12 if self.total_s > 0 else None,
                   tflops_peak=self.peak_tflops or None,
                   samples_per_s=batch_size * world_size / step_s if step_s > 0 else None)


class MetricsLog:
    """The run's logs under ``out``: written by rank 0, a no-op on the other ranks."""

    def __init__(self, out: Path, ctx: Any):
        self.out, self.ctx = out, ctx
        self.tb = None
        self.bar = None

    def open(self, cfg: Any, total_steps: int, step: int) -> None:
        if not self.ctx.is_main:
            return
        if cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=step, desc="train", unit="step",
                            dynamic_ncols=True)
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.out / "logs" / "tensorboard"), purge_step=step + 1)
        path = self.out / METRICS_FILE
        if not path.exists():
            with open_no_follow(path, "w", newline="") as fh:
                csv.writer(fh).writerow(METRIC_COLUMNS)

    def progress(self, row: dict[str, Any]) -> None:
        """One step on the progress bar."""
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['train_loss']:.4g}", lr=f"{row['lr']:.3g}",
                                 delta=f"{row['huber_delta']:.3g}", sps=f"{row['samples_per_s'] or 0:.3g}")

    def log(self, row: dict[str, Any]) -> None:
        if not self.ctx.is_main:
            return
        with open_no_follow(self.out / METRICS_FILE, "a", newline="") as fh:   # a planted link is not followed
            csv.writer(fh).writerow(["" if row.get(c) is None else row.get(c) for c in METRIC_COLUMNS])
        if self.tb is not None:
            for name in METRIC_COLUMNS[2:]:
                if isinstance(row.get(name), (int, float)):
                    self.tb.add_scalar(f"train/{name}" if not name.startswith("dev") else f"dev/{name}",
                                       row[name], row["step"])

    def truncate(self, step: int) -> None:
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


__all__ = ["METRICS_FILE", "METRIC_COLUMNS", "Timing", "MetricsLog"]
