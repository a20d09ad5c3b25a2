"""The one directory swap: put a finished directory in the place of another, so that a kill at any
point leaves the old directory or the new one under the final name. Checkpoints
(`models.checkpoint`), model exports (`models.training.export`) and every command's ``--out``
(`workflow.replace_out`) publish through it.

    new = temporary_sibling(dest)      # .<name>.tmp-<pid>, beside dest (same file system)
    ... write everything into new ...
    swap_into_place(new, dest)

The swap is one ``renameat2(RENAME_EXCHANGE)`` on Linux: atomic, ``dest`` always names a complete
directory, and the old one (now at the temporary name) is removed afterwards. Where the system or
file system cannot exchange, the old directory is renamed aside to ``.<name>.old-<pid>`` first and
the new one renamed in; a kill between those two renames leaves the old directory aside, and
`recover` (which every writer runs before it writes) puts it back under its name. Leftovers of a
killed writer (its temporary, or an aside copy once ``dest`` exists again) are removed by `recover`.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

from .jsonfile import fsync_dir
from .writerlock import pid_alive

TMP_TAG = ".tmp-"
OLD_TAG = ".old-"
_LEFTOVER = re.compile(r"\.(?P<name>.+)(?P<tag>\.tmp-|\.old-)(?P<pid>\d+)")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def temporary_sibling(dest: Path) -> Path:
    """Where this process writes the directory that will replace ``dest``: ``.<name>.tmp-<pid>``."""
    return dest.parent / f".{dest.name}{TMP_TAG}{os.getpid()}"


def swap_into_place(new: Path, dest: Path) -> None:
    """Put the complete directory ``new`` (a sibling of ``dest``) under the name ``dest``, replacing
    what is there as a whole, and make the rename durable. Raises OSError as the rename does (EXDEV
    or EBUSY when ``dest`` is a mount point: the caller decides what to do then)."""
    if not (dest.exists() or dest.is_symlink()):
        os.rename(new, dest)
    elif exchange(new, dest):
        remove(new)  # now the old directory
    else:
        aside = dest.parent / f".{dest.name}{OLD_TAG}{os.getpid()}"
        os.rename(dest, aside)
        os.rename(new, dest)  # a kill before this line leaves ``aside``: `recover` puts it back
        remove(aside)
    fsync_dir(dest.parent)  # the swap survives a power cut, not only a kill


def dead_writer(pid: int) -> bool:
    """Whether the writer ``pid`` that left a temporary or aside directory is gone. Our own pid
    counts as gone: a leftover with it is from an earlier process that had the same pid."""
    return pid == os.getpid() or not pid_alive(pid)


def recover(dest: Path, stale: Callable[[int], bool] = dead_writer) -> None:
    """Settle what killed swaps into ``dest`` left beside it: an aside copy is put back when
    ``dest`` is missing (the kill fell between the two renames), other leftovers are removed.
    ``stale(pid)`` says whose leftovers they are (default: writers no longer running)."""
    _settle(dest.parent, dest.name, stale)


def recover_all(parent: Path, stale: Callable[[int], bool] = dead_writer) -> None:
    """`recover` for every directory in ``parent`` (e.g. all the checkpoints of a run)."""
    _settle(parent, None, stale)


def _settle(parent: Path, only: str | None, stale: Callable[[int], bool]) -> None:
    if not parent.is_dir():
        return
    for sibling in sorted(parent.iterdir()):  # ".x.old-" sorts before ".x.tmp-": asides first
        found = _LEFTOVER.fullmatch(sibling.name)
        if found is None or (only is not None and found["name"] != only) or not stale(int(found["pid"])):
            continue
        dest = parent / found["name"]
        try:
            if found["tag"] == OLD_TAG and not (dest.exists() or dest.is_symlink()):
                os.rename(sibling, dest)
            else:
                remove(sibling)
        except FileNotFoundError:  # settled meanwhile by another process
            pass


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def remove(path: Path) -> None:
    """Delete a file, a link (never its target) or a directory tree."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


__all__ = ["TMP_TAG", "OLD_TAG", "temporary_sibling", "swap_into_place", "dead_writer", "recover", "recover_all",
           "exchange", "remove"]
