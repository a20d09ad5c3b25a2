"""Replace an output directory as a whole: a kill at any instant leaves the old result or the new one.

Outputs are written into a temporary sibling ``.<name>.new-<pid>`` of the output directory, then
swapped into place. On Linux the swap is one ``renameat2(RENAME_EXCHANGE)``: the directory name
points at the old tree, then at the new one, never at nothing or a mix; the old tree (now under
the temporary name) is then removed. Where the exchange is not available the old tree is renamed
aside to ``.<name>.old-<pid>`` and the new one renamed in; a kill between those two renames leaves
only the aside copy, which `recover` (run before every new write) renames back.

Every temporary name starts with ``.<name>.`` and lives in the parent directory, beside the
advisory lock file ``.<name>.lock`` that guards the output, never inside the output itself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from models.checkpoint import _fsync_dir

#: renameat2 flag: swap the two names atomically (Linux >= 3.15, glibc >= 2.28)
RENAME_EXCHANGE = 2
#: renameat2 "relative to the current directory"
AT_FDCWD = -100


def staging_dir(final: Path, kind: str, pid: int | None = None) -> Path:
    """The temporary sibling of ``final`` of ``kind`` ("new" or "old") owned by process ``pid``."""
    return final.parent / f".{final.name}.{kind}-{os.getpid() if pid is None else pid}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(final: Path, kind: str) -> list[tuple[Path, int]]:
    """(path, pid) of every ``.<name>.<kind>-<pid>`` sibling, oldest name order."""
    found = []
    for path in final.parent.glob(f".{final.name}.{kind}-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit():
            found.append((path, int(pid)))
    return sorted(found)


def recover(final: Path) -> None:
    """Undo what a killed writer left: put an aside copy back if ``final`` is missing, and remove
    the half-written and aside trees of writers that are gone."""
    if not final.parent.is_dir():
        return
    asides = [(p, pid) for p, pid in _leftovers(final, "old") if not _pid_alive(pid)]
    if asides and not final.exists():
        asides[-1][0].rename(final)   # killed between the two renames: the old result comes back
        asides = asides[:-1]
    for path, _ in asides + [(p, pid) for p, pid in _leftovers(final, "new") if not _pid_alive(pid)]:
        shutil.rmtree(path, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step; False where the system cannot."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True) if name else None
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):   # a file system without the exchange
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def replace_dir(new: Path, final: Path) -> None:
    """Put the complete tree ``new`` at ``final``; the earlier tree there is removed."""
    if not final.exists():
        new.rename(final)
    elif _exchange(new, final):
        shutil.rmtree(new)            # ``new`` now names the earlier tree
    else:
        aside = staging_dir(final, "old")
        final.rename(aside)
        new.rename(final)
        shutil.rmtree(aside)
    _fsync_dir(final.parent)   # the swap survives a power cut, not only a kill


@contextmanager
def replaced_atomically(final: str | Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``final`` to write into; on a clean exit it replaces
    ``final`` as a whole, on an error it is removed and ``final`` is left as it was.

    A symlinked ``final`` is replaced at its target, so the link keeps pointing where it did.
    """
    final = Path(final).absolute()
    if final.is_symlink():
        final = final.resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    recover(final)
    staging = staging_dir(final, "new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, final)
