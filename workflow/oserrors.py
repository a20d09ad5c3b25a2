"""One line for an operating-system error (no space, permission, read-only, not a directory, ...),
and its kind.

`workflow.cli.main` turns any `OSError` a stage lets through into
``namsa: error: <command> <path>: <strerror>; <what to do>``: the path and the system's reason are
what a user needs, a traceback is not. The errno decides the kind (`os_error_kind`): a path the
user gave that cannot be used (permission, read-only, not a directory, ...) is bad input, exit 2;
anything else (a full disk or quota, a file size limit, an I/O error, too many open files) is the
environment failing, exit 1.
"""
from __future__ import annotations

import errno
import os

from namsa.errors import RunError, UserError

#: errnos that mean the path given cannot be used as asked: the user chooses another (bad input)
PATH_ERRNOS: frozenset[int] = frozenset({
    errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENOENT, errno.EEXIST,
    errno.ENAMETOOLONG, errno.ELOOP})

#: what to do, by errno; anything else gets `OTHER_ADVICE`
ADVICE: dict[int, str] = {
    errno.ENOSPC: "the disk is full: free space or point --out (or execution.data_dir) at a bigger file system, "
                  "then rerun (finished work is kept)",
    errno.EDQUOT: "your disk quota is used up: free space or write elsewhere, then rerun",
    errno.EFBIG: "the file grew past the size this system or your limits allow (ulimit -f): raise the limit or "
                 "write elsewhere, then rerun",
    errno.EACCES: "permission denied: choose a directory you may write (and files you may read), or fix the "
                  "permissions",
    errno.EPERM: "the operation is not permitted there: choose another directory",
    errno.EROFS: "the file system is read-only: choose a writable --out",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.EISDIR: "the path is a directory where a file was expected: choose another path",
    errno.ENOENT: "a part of the path does not exist: check the path (parents are created only under a "
                  "writable directory)",
    errno.EEXIST: "something is already there: choose another path or move it away",
    errno.ENAMETOOLONG: "the path is too long: choose a shorter one",
    errno.ELOOP: "the path loops through symbolic links: choose a plain directory",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) and rerun",
    errno.EIO: "the storage reported an I/O error: check the disk, then rerun",
}
OTHER_ADVICE = "check the path and the file system, then rerun (finished work is kept)"


def os_error_line(command: str | None, exc: OSError, out: object = None) -> str:
    """``<command> <path>: <strerror>; <advice>`` on one line (the text after ``namsa: error: ``).

    An error raised by a write (not an open) carries no file name: the command's ``out`` stands in.
    """
    where = exc.filename if exc.filename is not None else (f"writing under {out}" if out is not None else "")
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split()))
    advice = ADVICE.get(exc.errno or -1, OTHER_ADVICE)
    head = " ".join(part for part in (command or "", str(where)) if part)
    return f"{head}: {reason}; {advice}" if head else f"{reason}; {advice}"


def os_error_kind(exc: OSError) -> type[UserError] | type[RunError]:
    """`UserError` when the errno says the path given cannot be used, `RunError` for any other
    (the disk, the quota, a limit or the device failed under a valid request)."""
    return UserError if exc.errno in PATH_ERRNOS else RunError


def os_error(command: str | None, exc: OSError, out: object = None) -> UserError | RunError:
    """The one-line error of `os_error_line`, of the kind `os_error_kind` decides."""
    return os_error_kind(exc)(os_error_line(command, exc, out))
