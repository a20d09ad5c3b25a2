"""How a `namsa` child process tells the command that started it the kind of its error.

`namsa run` starts its training as a `namsa train` child, alone or under a launcher (torchrun,
srun, mpiexec) that starts one per rank. The child's exit status does not survive every launcher:
torchrun exits 1 whatever its ranks exited with, and a rank stopped after a peer's error has a
status of its own. So a `namsa` process whose environment names a status folder (``STATUS_ENV``,
set by the parent for that child only) leaves its exit status and its one line there before it
exits, one file per process; the parent reads them back (`refused_input`) and keeps the child's
kind: a training that refused its input exits 2 under `namsa run` as under `namsa train`.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from stage.jsonfile import write_json_atomic

from .errors import EXIT_BAD_INPUT

#: the environment variable naming the folder a child leaves its status in
STATUS_ENV = "NAMSA_CHILD_STATUS_DIR"


def record(status: int, message: str) -> None:
    """Leave this process's exit status and one-line reason where its parent asked (if it asked)."""
    folder = os.environ.get(STATUS_ENV)
    if not folder:
        return
    try:
        write_json_atomic(Path(folder) / f"{socket.gethostname()}.{os.getpid()}.json",
                          {"status": status, "message": message})
    except OSError:
        pass  # a full disk, say: the exit status is then all the parent learns


def clear(folder: Path) -> None:
    """An empty status folder for the next child (the records of an earlier one removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink(missing_ok=True)


def refused_input(folder: Path, exit_status: int | None) -> str | None:
    """The one line of a child that exited for bad input, or None when it did not.

    A child refused its input when one of its processes recorded exit status 2 (the others of a
    multi-rank job fail because of that one), or when the child itself exited 2 without a record
    (argparse's own errors): then the line is ``""``, and the caller names the log.
    """
    for record in _records(folder):
        if record.get("status") == EXIT_BAD_INPUT and isinstance(record.get("message"), str):
            return record["message"]
    return "" if exit_status == EXIT_BAD_INPUT else None


def _records(folder: Path) -> list[dict]:
    """The records in ``folder``, in name order (host, then pid), so the line chosen is the same each time."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a killed writer's temporary file: the records, or the exit status, decide
        if isinstance(record, dict):
            found.append(record)
    return found
