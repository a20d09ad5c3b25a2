"""Replace an output directory as a whole, so a kill at any point leaves the old result or the new one.

    with replaced_atomically(out, owned) as tmp:   # .<name>.tmp-<pid> beside out, empty
        ... write everything into tmp ...          # swapped into place on a clean exit,
                                                   # discarded on an error
or the three steps by hand: start_replacing, finish_replacing, discard.

The swap is `stage.dir_swap`'s (the one swap checkpoints and model exports use too): atomic on
Linux, ``out`` always names a complete result. Leftovers of a killed run (temporary and aside
siblings whose process is gone) are settled by the next `start_replacing` (`stage.dir_swap.recover`:
an aside copy whose ``out`` is missing is put back first).

Only a directory that is empty or holds what an earlier run wrote is replaced: ``owned`` names,
and the command's ``marker`` file (its summary) among them, so that a user's own ``figures/`` or
``potential.npy`` is refused, never deleted.

In place: an ``out`` that cannot be renamed (a mount point, e.g. a container volume, or one whose
parent is read-only) is detected before any work; the result is then written into
``out/.namsa.tmp-<pid>`` and moved in entry by entry, the marker removed first and put back last,
so a kill in between leaves a result without its marker, which the next run replaces. A swap that
fails all the same with EXDEV or EBUSY (a mount point not seen) falls back to the same moves.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from namsa.errors import UserError
from stage.dir_swap import TMP_TAG, dead_writer, recover, remove, swap_into_place, temporary_sibling
from stage.jsonfile import fsync_dir

#: the lock file (workflow.outlock) of an ``out`` whose parent is read-only, and the prefix of an
#: in-place temporary result: both live inside ``out`` and are never outputs
INSIDE_LOCK = ".namsa-out.lock"
INSIDE_TMP = f".namsa{TMP_TAG}"
#: present while a result is moved in entry by entry: a kill then leaves outputs without their
#: marker, which are still ours to replace
MOVING = ".namsa-moving"
#: what a swap across a mount boundary fails with
_NOT_RENAMEABLE = (errno.EXDEV, errno.EBUSY)


@contextmanager
def replaced_atomically(out: str | Path, owned: Callable[[str], bool], marker: str | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory; on a clean exit its contents replace ``out`` as a whole,
    on an error it is removed and ``out`` is left as it was. A symlinked ``out`` is replaced at its
    target, so the link keeps pointing where it did. ``marker``: see `start_replacing`."""
    out = Path(os.path.abspath(out))
    if out.is_symlink():
        out = out.resolve()
    tmp = start_replacing(out, owned, marker)
    try:
        yield tmp
    except BaseException:
        discard(tmp)
        raise
    finish_replacing(tmp, out, marker)


def start_replacing(out: str | Path, owned: Callable[[str], bool], marker: str | None = None) -> Path:
    """An empty temporary directory to write into (a sibling of ``out``, or inside it when ``out``
    cannot be renamed); refuses an ``out`` that cannot be written or that holds files an earlier
    run did not write: ``owned(name)`` says which names are outputs, and a non-empty ``out`` must
    hold the ``marker`` file (the command's summary) to count as an earlier result."""
    out = Path(os.path.abspath(out))
    refuse_file_above(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(out)
        _refuse_foreign_files(out, owned, marker)
        tmp = out / f"{INSIDE_TMP}{os.getpid()}" if in_place(out) else temporary_sibling(out)
        remove(tmp)
        tmp.mkdir()
    except OSError as exc:
        raise UserError(f"--out {out} cannot be written ({exc.strerror or exc}); choose a directory you can "
                        "write to") from None
    return tmp


def in_place(out: Path) -> bool:
    """Whether ``out`` must be filled in place: an existing directory that is a mount point or
    whose parent this process cannot write (a rename of ``out`` itself would fail)."""
    return out.is_dir() and (not os.access(out.parent, os.W_OK | os.X_OK) or is_mount_point(out))


def is_mount_point(path: Path) -> bool:
    """A mount point, bind mounts included (their device is the parent's, so ismount misses them)."""
    if os.path.ismount(path):
        return True
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    real = os.path.realpath(path)
    return any(len(f := line.split()) > 4 and _unescape(f[4]) == real for line in mounts)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def finish_replacing(tmp: Path, out: str | Path, marker: str | None = None) -> None:
    """Put the complete result ``tmp`` in the place of ``out`` and remove the old result."""
    out = Path(os.path.abspath(out))
    if tmp.parent != out:
        try:
            swap_into_place(tmp, out)
            return
        except OSError as exc:
            if exc.errno not in _NOT_RENAMEABLE:
                raise
    _move_in(tmp, out, marker)
    fsync_dir(out.parent)  # the moves survive a power cut, not only a kill


def _move_in(tmp: Path, out: Path, marker: str | None) -> None:
    """Replace the outputs in ``out`` by the entries of ``tmp`` one by one (``out`` stays where it
    is); the old marker goes first and the new one comes last, so a half-moved result is never
    taken for a finished one."""
    (out / MOVING).touch()
    old = [p for p in out.iterdir() if not _never_output(p.name)]
    for path in sorted(old, key=lambda p: p.name != marker):
        remove(path)
    for path in sorted(tmp.iterdir(), key=lambda p: p.name == marker):
        shutil.move(str(path), str(out / path.name))   # a copy where a rename cannot cross a mount
    remove(tmp)
    (out / MOVING).unlink()
    fsync_dir(out)


def _never_output(name: str) -> bool:
    return name in (INSIDE_LOCK, MOVING) or name.startswith(INSIDE_TMP)


def discard(tmp: Path) -> None:
    """Remove an unfinished temporary result (after a failure); never raises."""
    try:
        remove(tmp)
    except OSError:
        pass


def clean_leftovers(out: Path) -> None:
    """Remove the temporary and aside siblings of ``out`` left by killed runs (their process is gone),
    putting an aside result back first when ``out`` itself is missing; and in-place temporaries."""
    if not out.parent.is_dir():
        return
    if out.is_dir():
        for inside in out.iterdir():
            prefix_pid = inside.name[len(INSIDE_TMP):]
            if inside.name.startswith(INSIDE_TMP) and prefix_pid.isdigit() and dead_writer(int(prefix_pid)):
                remove(inside)
    recover(out)


def refuse_file_above(out: Path, flag: str = "--out") -> None:
    """One line when a path component above ``out`` is a file (mkdir would fail with ENOTDIR)."""
    for above in out.parents:
        if above.exists():
            if not above.is_dir():
                raise UserError(f"{flag} {out} lies below {above}, which is a file, not a directory; choose a "
                                "directory path")
            return


def _refuse_foreign_files(out: Path, owned: Callable[[str], bool], marker: str | None) -> None:
    if not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir() if not _never_output(p.name))
    foreign = [name for name in names if not owned(name)]
    if names and marker is not None and marker not in names and not (out / MOVING).exists():
        foreign = foreign or names   # output names without the summary: not an earlier result of ours
    if foreign:
        raise UserError(f"--out {out} holds files this command did not write (e.g. {foreign[0]!r}) and would be "
                        "replaced as a whole; choose a new or empty directory (or an earlier output of this command)")
