"""Replace an output directory as a whole, so a kill at any point leaves the old result or the new one.

    with replaced_atomically(out, owned) as tmp:   # .<name>.tmp-<pid> beside out, empty
        ... write everything into tmp ...          # swapped into place on a clean exit,
                                                   # discarded on an error
or the three steps by hand: start_replacing, finish_replacing, discard.

The swap is one ``renameat2(RENAME_EXCHANGE)`` on Linux (atomic: ``out`` always names a complete
result); elsewhere, or on a file system without it, the old result is renamed aside to
``.<name>.old-<pid>`` first and the new one renamed in. Leftovers of a killed run (temporary and
aside siblings whose process is gone) are cleaned up by the next `start_replacing`; an aside
copy whose ``out`` is missing (a kill between the two renames) is put back first.

Only a directory that is empty or holds what an earlier run wrote (``owned`` names) is replaced:
a user's ``--out .`` full of other files is refused, never deleted.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from namsa.errors import UserError
from stage.jsonfile import fsync_dir
from stage.writerlock import pid_alive

TMP_TAG = ".tmp-"
OLD_TAG = ".old-"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@contextmanager
def replaced_atomically(out: str | Path, owned: Callable[[str], bool]) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``out``; on a clean exit it replaces ``out`` as a whole,
    on an error it is removed and ``out`` is left as it was. A symlinked ``out`` is replaced at its
    target, so the link keeps pointing where it did."""
    out = Path(os.path.abspath(out))
    if out.is_symlink():
        out = out.resolve()
    tmp = start_replacing(out, owned)
    try:
        yield tmp
    except BaseException:
        discard(tmp)
        raise
    finish_replacing(tmp, out)


def start_replacing(out: str | Path, owned: Callable[[str], bool]) -> Path:
    """An empty temporary sibling of ``out`` to write into; refuses an ``out`` that cannot be
    written or that holds files an earlier run did not write (``owned(name)`` says which)."""
    out = Path(os.path.abspath(out))
    refuse_file_above(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(out)
        _refuse_foreign_files(out, owned)
        tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}"
        _remove(tmp)
        tmp.mkdir()
    except OSError as exc:
        raise UserError(f"--out {out} cannot be written ({exc.strerror or exc}); choose a directory you can "
                        "write to") from None
    return tmp


def finish_replacing(tmp: Path, out: str | Path) -> None:
    """Put the complete result ``tmp`` in the place of ``out`` and remove the old result."""
    out = Path(os.path.abspath(out))
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        _remove(tmp)  # now the old result
    else:
        aside = out.parent / f".{out.name}{OLD_TAG}{os.getpid()}"
        os.rename(out, aside)
        os.rename(tmp, out)
        _remove(aside)
    fsync_dir(out.parent)  # the swap survives a power cut, not only a kill


def discard(tmp: Path) -> None:
    """Remove an unfinished temporary result (after a failure); never raises."""
    try:
        _remove(tmp)
    except OSError:
        pass


def clean_leftovers(out: Path) -> None:
    """Remove the temporary and aside siblings of ``out`` left by killed runs (their process is gone),
    putting an aside result back first when ``out`` itself is missing."""
    if not out.parent.is_dir():
        return
    for sibling in sorted(out.parent.iterdir()):
        pid = _leftover_pid(sibling.name, out.name)
        if pid is None or _alive(pid):
            continue
        if OLD_TAG in sibling.name[len(out.name) + 1:] and not (out.exists() or out.is_symlink()):
            os.rename(sibling, out)
        else:
            _remove(sibling)


def _leftover_pid(name: str, out_name: str) -> int | None:
    for tag in (TMP_TAG, OLD_TAG):
        prefix = f".{out_name}{tag}"
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
    return None


def _alive(pid: int) -> bool:
    # our own leftovers are from an earlier process that had our pid
    return pid != os.getpid() and pid_alive(pid)


def refuse_file_above(out: Path, flag: str = "--out") -> None:
    """One line when a path component above ``out`` is a file (mkdir would fail with ENOTDIR)."""
    for above in out.parents:
        if above.exists():
            if not above.is_dir():
                raise UserError(f"{flag} {out} lies below {above}, which is a file, not a directory; choose a "
                                "directory path")
            return


def _refuse_foreign_files(out: Path, owned: Callable[[str], bool]) -> None:
    if not out.is_dir():
        return
    foreign = sorted(p.name for p in out.iterdir() if not owned(p.name))
    if foreign:
        raise UserError(f"--out {out} holds files this command did not write (e.g. {foreign[0]!r}) and would be "
                        "replaced as a whole; choose a new or empty directory (or an earlier output of this command)")


def _exchange(a: Path, b: Path) -> bool:
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


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
