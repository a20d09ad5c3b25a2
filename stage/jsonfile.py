"""Writing files atomically (temporary sibling, fsync, rename): the one writer every room uses
for manifests, checkpoint states, model cards, summaries and metrics, so a kill or a full disk never
leaves half a file behind."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

#: prefix of the temporary sibling; models.checkpoint removes leftovers of killed writers by it
TMP_PREFIX = ".tmp-"


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in directory ``path`` durable (it survives a power cut, not only a kill)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike, payload: Any, *, sort_keys: bool = False,
                      default: Callable[[Any], Any] | None = None, allow_nan: bool = True,
                      make_parents: bool = False) -> None:
    """Write ``payload`` as JSON (indent 1) to ``path``: readers see the old file or the new one.

    The temporary file is unique per process and thread, readable like any file the user creates
    (mkstemp's 0600 is widened to 0666 less the umask, for stores on shared file systems), and
    removed again when the write fails.
    """
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=".json", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=1, sort_keys=sort_keys, default=default, allow_nan=allow_nan)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
