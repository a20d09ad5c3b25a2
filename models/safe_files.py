"""Reading files someone else may have made (a model directory, a run directory, a stored plan) safely:
the one place that opens them and parses their JSON.

`open_regular(path)` opens a file for reading only once its `lstat` shows a regular file: a symbolic
link, a FIFO or a device is refused before any open, so nothing a link points at is ever read (a FIFO
would block, a device or another user's file would be read). `parse_json_bytes` parses untrusted
bytes with a size cap, UTF-8, a nesting cap (`MAX_JSON_DEPTH`: the json module recurses) and no
NaN/Infinity. `inside(base, relpath)` resolves a path named inside a card or a checkpoint state and
refuses it when it (or a symbolic link on the way) leaves ``base``. Every refusal is one line
(`models.errors.ModelDirError`, a `UserError`: exit 2 in the CLI).
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ModelDirError

#: JSON nesting deeper than this is refused before parsing (the json module recurses)
MAX_JSON_DEPTH = 64


def parse_json_bytes(raw: bytes, where: str, limit: int, kind: str = "a card") -> Any:
    """JSON from untrusted bytes: at most ``limit`` bytes, UTF-8, nesting depth and syntax checked; one
    line otherwise (``kind``: what the file should have been, for the message, e.g. "a card")."""
    if len(raw) > limit:
        raise ModelDirError(f"{where} is {len(raw)} bytes, more than the {limit} {kind} may have; it is not {kind}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelDirError(f"{where} is not UTF-8 text (byte {exc.start}); it is damaged or not {kind}") from None
    if _depth(text) > MAX_JSON_DEPTH:
        raise ModelDirError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels; it is not {kind}")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ModelDirError(f"{where} is not valid JSON ({reason}); it is damaged or not {kind}") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(text: str) -> int:
    """Deepest bracket nesting outside strings (bounds json's recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def open_regular(path: str | Path, what: str = "file") -> BinaryIO:
    """``path`` opened for binary reading once its `lstat` shows a regular file (not a symbolic link,
    FIFO, socket or device); opened with O_NOFOLLOW | O_NONBLOCK and its `fstat` compared, so a
    file swapped in between is refused too. A link's target is never opened (a FIFO would block,
    a device or another user's file would be read). One-line `ModelDirError` otherwise."""
    path = Path(path)
    try:
        before = os.lstat(path)
        if not stat.S_ISREG(before.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(before.st_mode) else "not a regular file"
            raise ModelDirError(f"{what} {path} is {kind}; a model directory holds regular files only: put the "
                                f"file itself there (cp -L), not a link or a special file")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelDirError(f"{what} {path} cannot be read ({exc.strerror or exc}); check the model "
                            f"directory") from None
    after = os.fstat(fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(after.st_mode):
        os.close(fd)
        raise ModelDirError(f"{what} {path} changed while it was opened; check the model directory and try again")
    return os.fdopen(fd, "rb")


def inside(base: str | Path, relpath: str | Path, what: str = "path") -> Path:
    """``base / relpath`` resolved (symlinks followed); refused with one line when it leaves ``base``.

    For every path a card or a checkpoint state names (weights file, metrics CSV, ...): the file a
    user received decides nothing outside its own directory.
    """
    text = str(relpath)
    if not text or "\x00" in text:
        raise ModelDirError(f"{what} {text!r} in {base} is not a file name")
    root = Path(base).resolve()
    target = (root / relpath).resolve()
    if not target.is_relative_to(root):
        raise ModelDirError(f"{what} {text!r} leads outside {base} (to {target}); a model directory may only "
                            f"name files inside itself")
    return target


__all__ = ["open_regular", "parse_json_bytes", "inside", "MAX_JSON_DEPTH"]
