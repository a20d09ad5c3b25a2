"""One writer per output: the advisory lock that `namsa train`, `evaluate`, `reconstruct`, `run` and
`scaling` hold on their ``--out`` for the whole command.

The rule: the lock of output directory ``DIR`` is the file ``.<name>.lock`` in the parent of DIR's
real path (``runs/a`` -> ``runs/.a.lock``; inside DIR when the parent cannot be written). Beside
the output, not inside it, so that it is one rule for every
command, also for outputs that are written into a temporary sibling and renamed into place, and so
that the lock never becomes part of what a user copies away. The file is ``flock``'ed: the kernel
releases the lock when its holder exits, even on kill -9, so a lock is never stale; the file itself
stays (removing a flock'ed file would let two processes lock two different files of one name) and
holds the holder's pid, host, command and start time for the message the next process prints.

A process that finds the lock held exits with status 2 and one line naming the holder, or with
``--wait`` says that it waits and blocks until the holder is gone. A `namsa run` starts its
training as a `namsa train` child process on the same directory: the run passes the locks it holds
in ``$NAMSA_OUT_LOCKS_HELD`` and the child does not lock them again.

filelock is not used: its Unix lock opens the file with O_TRUNC, which would wipe the holder's
details every time another process tries the lock.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Iterator

from namsa.errors import UserError

from .oserrors import ADVICE, OTHER_ADVICE, os_error_kind
from .replace_out import INSIDE_LOCK, refuse_file_above

#: lock files held by an ancestor process (a `namsa run` whose training child locks the same --out)
HELD_ENV = "NAMSA_OUT_LOCKS_HELD"


class OutputBusy(UserError):
    """Another live process holds the output's lock."""


def lock_path(out: str | os.PathLike) -> Path:
    """The lock file of output directory ``out``: ``<parent>/.<name>.lock`` of its real path, so
    that every name of one directory (a symbolic link to it) shares one lock; inside ``out`` when
    that cannot be made (the filesystem root, or an existing ``out`` under a parent this process may
    not write, such as a writable volume mounted below a read-only folder)."""
    out = Path(os.path.realpath(out))
    if not out.name or (out.is_dir() and not os.access(out.parent, os.W_OK | os.X_OK)):
        return out / INSIDE_LOCK
    return out.parent / f".{out.name}.lock"


#: seconds a process that found the lock held waits for the holder to write its details: the holder
#: takes the lock first and records itself just after, so a contender can read an empty file
RECORD_PATIENCE_S = 2.0
NOT_RECORDED = "another process (it has not recorded itself yet)"


def holder_text(raw: str) -> str:
    """``namsa train (pid 123 on host, since 21:05)`` from a lock file's contents."""
    try:
        info = json.loads(raw)
        since = time.strftime("%H:%M", time.localtime(float(info["started"])))
        return f"`{info['command']}` (pid {int(info['pid'])} on {info['host']}, since {since})"
    except (ValueError, KeyError, TypeError):
        return NOT_RECORDED


def _open(path: Path, out: Path, flag: str) -> IO[str]:
    refuse_file_above(out, flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a link planted at the lock's name must not have the holder's details written through it
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        return os.fdopen(fd, "r+")
    except OSError as exc:
        advice = ADVICE.get(exc.errno or -1, OTHER_ADVICE)
        raise os_error_kind(exc)(f"{flag} {out}: cannot create the lock file {path} ({exc.strerror}); {advice}") from None


def _record(fh: IO[str], command: str) -> None:
    """Write who holds the lock (best effort: a full disk must not stop the command here)."""
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                             "started": time.time()}))
        fh.flush()
    except OSError:
        pass


def _read_holder(fh: IO[str], patience_s: float = RECORD_PATIENCE_S) -> str:
    """The holder's details, re-read for up to ``patience_s`` while the holder has locked the file but
    not yet written them (or is half-way through writing)."""
    deadline = time.monotonic() + patience_s
    while True:
        fh.seek(0)
        text = holder_text(fh.read())
        if text != NOT_RECORDED or time.monotonic() >= deadline:
            return text
        time.sleep(0.02)


def _held_by_ancestor(path: Path) -> bool:
    return str(path) in os.environ.get(HELD_ENV, "").split(os.pathsep)


@contextlib.contextmanager
def hold_output(out: str | os.PathLike, command: str, *, wait: bool = False, flag: str = "--out",
                what: str = "output directory") -> Iterator[Path]:
    """Hold the lock of ``out`` for the body; ``command`` (e.g. ``namsa train``) names the holder.

    Busy and ``wait`` False: `OutputBusy` (one line naming the holder). Busy and ``wait``: one line
    on stderr, then block until the holder exits. Yields the lock file's path.
    """
    out = Path(out)
    path = lock_path(out)
    if _held_by_ancestor(path):
        yield path
        return
    fh = _open(path, out, flag)
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fh)
            if not wait:
                raise OutputBusy(f"{what} {out} is in use by {holder}; wait for it or pass --wait") from None
            print(f"namsa: waiting: {what} {out} is in use by {holder}; this command starts when it finishes "
                  f"(Ctrl-C to give up)", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        _record(fh, command)
        previous = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = os.pathsep.join(filter(None, [previous, str(path)]))
        try:
            yield path
        finally:
            _restore_env(previous)
            with contextlib.suppress(OSError):
                fh.truncate(0)  # nobody holds it now
    finally:
        fh.close()  # closing the last descriptor releases the flock


def _restore_env(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(HELD_ENV, None)
    else:
        os.environ[HELD_ENV] = previous
