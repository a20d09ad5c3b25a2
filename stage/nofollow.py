"""Open a file for writing without following a symbolic link at its name.

A run or output directory may come from someone else; a link planted where namsa appends a log
(``logs/run.log -> ~/.bashrc``) must fail (ELOOP, which the CLI turns into one line), not write
into the link's target. The check runs in the kernel at open time, so no race with a check
made earlier is possible.
"""
from __future__ import annotations

import os
from typing import IO

_FLAGS = {"a": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "w": os.O_WRONLY | os.O_TRUNC | os.O_CREAT}


def open_no_follow(path: str | os.PathLike, mode: str = "a", newline: str | None = None) -> IO[str]:
    """``open(path, mode)`` for text mode ``"a"`` or ``"w"``, refusing a symbolic link at ``path``."""
    fd = os.open(path, _FLAGS[mode] | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, mode, newline=newline)
