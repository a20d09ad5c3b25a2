"""Per-step counters of a gradient-reduction engine and an optional Chrome-trace timeline.

Times are seconds of wall clock (``time.perf_counter``). ``compute`` is the time the trainer spent
between two ``synchronize()`` calls (forward, backward, optimizer), ``wait`` the time
``synchronize()`` blocked, ``communication`` and ``coordination`` the time spent inside gradient
and readiness collectives (these overlap compute when an engine reduces during backward).
The timeline (open it in chrome://tracing or https://ui.perfetto.dev) has one row per thread.
"""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

COUNTERS = ("compute_s", "communication_s", "coordination_s", "wait_s",
            "collectives", "coordination_messages", "coordination_cycles", "bytes_sent")


class StepRecorder:
    """Thread-safe per-step counters; ``finish_step()`` returns one step's dict and starts the next."""

    def __init__(self, rank: int = 0, timeline: str | Path | None = None):
        self.rank = rank
        self._lock = threading.Lock()
        self._current = dict.fromkeys(COUNTERS, 0)
        self._events: list[dict] | None = [] if timeline else None
        self._timeline_path = Path(timeline).with_suffix(f".rank{rank}.json") if timeline else None
        self._t0 = time.perf_counter()
        self.steps = 0

    def add(self, **counts: float) -> None:
        """Add to this step's counters (names from ``COUNTERS``)."""
        with self._lock:
            for key, value in counts.items():
                self._current[key] += value

    def event(self, name: str, start: float, end: float, category: str) -> None:
        """Record a complete event on the timeline (no-op without one)."""
        if self._events is None:
            return
        with self._lock:
            self._events.append({"name": name, "cat": category, "ph": "X", "pid": self.rank,
                                 "tid": threading.current_thread().name,
                                 "ts": (start - self._t0) * 1e6, "dur": (end - start) * 1e6})

    @contextmanager
    def span(self, kind: str, name: str, **counts: float) -> Iterator[None]:
        """Time a block as ``kind`` (communication, coordination, wait, compute) and add counts."""
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.add(**{f"{kind}_s": end - start}, **counts)
            self.event(name, start, end, kind)

    def finish_step(self) -> dict:
        with self._lock:
            done, self._current = self._current, dict.fromkeys(COUNTERS, 0)
            self.steps += 1
            done["step"] = self.steps
        return done

    def close(self) -> Path | None:
        """Write the timeline JSON (``<timeline>.rank<R>.json``); return its path."""
        if self._timeline_path is None or self._events is None:
            return None
        self._timeline_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            payload = {"traceEvents": list(self._events), "displayTimeUnit": "ms"}
        self._timeline_path.write_text(json.dumps(payload))
        return self._timeline_path
