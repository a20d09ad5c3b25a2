"""The training child of `namsa run`: the shell command that runs `namsa train` on the run directory
under the profile's launcher, and what its end means.

The child writes its stdout and stderr to logs/train.log, time stamps around the job itself to
logs/train.started and logs/train.ended (so Parsl's own latency can be told apart from it), and, if
it fails, its exit status and one line to logs/train-status/ (workflow.child_status): a training
that refused its input is the run's bad input (exit 2), any other failure a failed stage (exit 1,
with the log's tail).
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from namsa.errors import NamsaError

from . import child_status, runner_io
from .config import PipelineConfig
from .errors import StageFailed, StageRefused
from .outlock import HELD_ENV
from .profiles import train_command
from .run_paths import RunPaths

#: lines of the training log quoted when training fails
LOG_TAIL_LINES = 25


def log_path(paths: RunPaths) -> Path:
    return paths.logs / "train.log"


def _status_dir(paths: RunPaths) -> Path:
    return paths.logs / "train-status"


def _stamp_files(paths: RunPaths) -> tuple[Path, Path]:
    return paths.logs / "train.started", paths.logs / "train.ended"


def command(cfg: PipelineConfig, paths: RunPaths, resume: bool) -> tuple[str, dict]:
    """The shell command of the training job and its Parsl resource specification."""
    cli_args = [str(paths.resolved_config), "--data", str(paths.data), "--out", str(paths.root),
                "--no-progress"] + (["--resume"] if resume else [])
    job, resource_spec = train_command(cfg.execution, cli_args)
    started, ended = (shlex.quote(str(p)) for p in _stamp_files(paths))
    job = f"date +%s.%N > {started}; {job}; rc=$?; date +%s.%N > {ended}; exit $rc"
    child_status.clear(_status_dir(paths))
    env = {child_status.STATUS_ENV: str(_status_dir(paths))}
    if os.environ.get(HELD_ENV):  # this run holds the run directory's lock: its `namsa train` must not wait on it
        env[HELD_ENV] = os.environ[HELD_ENV]
    exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in env.items())
    return exports + job, resource_spec


def failure(exc: BaseException, paths: RunPaths) -> NamsaError:
    """The run's error for a training job that ended with ``exc`` (Parsl's BashExitFailure carries
    the exit status): the child's own line if it refused its input, else a failed stage."""
    log = log_path(paths)
    refused = child_status.refused_input(_status_dir(paths), getattr(exc, "exitcode", None))
    if refused is not None:
        return StageRefused(refused or f"training refused its input (exit status 2); its line is in {log}")
    return StageFailed(f"training failed ({runner_io.one_line(exc)}); log: {log}", _tail(log, LOG_TAIL_LINES))


def stamps(paths: RunPaths) -> tuple[float | None, float | None]:
    """When the training job itself started and ended (epoch seconds; None where not written)."""
    return tuple(_read_stamp(p) for p in _stamp_files(paths))  # type: ignore[return-value]


def _read_stamp(path: Path) -> float | None:
    try:
        return float(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return None


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return f"(no log at {path})"
