"""The terminal live view of `namsa run`: one progress bar per stage (a live line on a terminal, a line
every 30 s in a log file), the wait that ticks it and the training steps it shows."""
from __future__ import annotations

import concurrent.futures
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import PipelineConfig
from .runner_io import progress_bar, tqdm_write


class LiveView:
    """Progress bars: simulation samples (with task counts), training steps, evaluation."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        # A terminal gets a live line; a log file (batch job, CI) a line every 30 s, not a flood.
        self.interval = 0.5 if sys.stderr.isatty() else 30.0
        self._shown = 0.0

    def start(self, total: int, desc: str, unit: str) -> None:
        self.close()
        self.bar = progress_bar(total, desc, unit, self.enabled)
        self._shown = time.time()

    def update(self, n: int, **postfix: Any) -> None:
        if self.bar is None:
            return
        self.bar.n = min(n, self.bar.total) if self.bar.total else n
        self.bar.set_postfix(postfix, refresh=False)
        if time.time() - self._shown >= self.interval:
            self.bar.refresh()
            self._shown = time.time()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def note(self, text: str) -> None:
        if self.enabled:
            tqdm_write(text)


def wait_ticking(futures: Sequence[concurrent.futures.Future], on_tick: Callable[[], None], period: float = 0.5) -> None:
    """Wait for every future, calling ``on_tick`` about every ``period`` seconds."""
    pending = set(futures)
    while pending:
        _, pending = concurrent.futures.wait(pending, timeout=period,
                                             return_when=concurrent.futures.FIRST_COMPLETED)
        on_tick()


def total_steps(cfg: PipelineConfig) -> int:
    """Training steps when fixed by training.max_steps; 0 (unknown) when set by epochs."""
    return int(cfg.training.max_steps or 0)


def last_step(metrics_csv: Path) -> int:
    """The last step logged in the training metrics CSV (first column), 0 before the first row."""
    try:
        with open(metrics_csv, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(fh.tell() - 4096, 0))
            last = fh.read().decode(errors="replace").strip().splitlines()[-1]
        return int(float(last.split(",")[0]))
    except (FileNotFoundError, IndexError, ValueError):
        return 0
