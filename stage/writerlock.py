"""The writer lock's holder: who writer.lock says has a store open, and whether that writer is alive."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from .layout import LOCK_NAME


def _lock_holder(text: str) -> tuple[int, str] | None:
    """(pid, host) that writer.lock records, or None when it is empty (no writer open). Stores
    written before the host was recorded hold a pid alone: this host's."""
    fields = text.split()
    if not fields or not fields[0].isdigit():
        return None
    return int(fields[0]), fields[1] if len(fields) > 1 else socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def writer_active(path: Path) -> str | None:
    """``"pid N on HOST"`` when a `StoreWriter` may have the store at ``path`` open, else None.

    Read from writer.lock without locking it (taking even a shared flock would make a writer
    starting at that moment fail): a live pid on this host, or any pid recorded by another host
    (whose liveness cannot be checked from here), counts as open; a writer killed with -9 on
    this host leaves a dead pid, which does not."""
    try:
        holder = _lock_holder((path / LOCK_NAME).read_text())
    except OSError:
        return None
    if holder is None:
        return None
    pid, host = holder
    if host == socket.gethostname() and not pid_alive(pid):
        return None
    return f"pid {pid} on {host}"
