"""One LMDB environment per (process, store): the handle cache, fork safety, opening environments and dbs."""
from __future__ import annotations

import errno
import os
import resource
from pathlib import Path
from typing import Any

import lmdb

from .errors import StoreError, StoreFullError, TruncatedStoreError
from .layout import DATA_NAME
from .lmdbfile import truncation
from .writerlock import writer_active

_DBS = (b"records", b"index", b"info")
#: errno values that mean "the disk is full" (EFBIG: a file-size limit, e.g. RLIMIT_FSIZE or quota).
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
        return True
    text = str(exc).lower()
    return any(os.strerror(e).lower() in text for e in _DISK_FULL_ERRNOS)


def _open_dbs(env: lmdb.Environment, create: bool) -> dict[bytes, Any]:
    return {name: env.open_db(name, create=create) for name in _DBS}


class _EnvEntry:
    def __init__(self, env: lmdb.Environment, dbs: dict[bytes, Any] | None, writable: bool):
        self.env, self.dbs, self.writable = env, dbs, writable
        self.refs = 1
        self.pid = os.getpid()


#: py-lmdb refuses to open one environment twice in a process, so readers and the writer of a
#: store in the same process share one handle (reference counted).
_ENVS: dict[str, _EnvEntry] = {}


def _forget_parent_envs() -> None:
    """After fork(): drop the parent's handles so the child opens its own (LMDB forbids sharing).

    py-lmdb's "already open in this process" guard survives fork, so a read-only (lock-free)
    handle is closed in the child, which only unmaps the child's copy. A writable handle is
    left alone: closing it would clear the parent's reader slots in the shared lock file.
    """
    for key, entry in list(_ENVS.items()):
        if not entry.writable:
            entry.env.close()
        del _ENVS[key]


os.register_at_fork(after_in_child=_forget_parent_envs)


def _acquire_env(path: Path, *, write: bool, map_size: int = 0, readahead: bool = False) -> _EnvEntry:
    key = os.path.realpath(path)
    entry = _ENVS.get(key)
    if entry is not None and entry.pid != os.getpid():
        entry = None  # inherited through fork(): never touch the parent's handle
    if entry is not None:
        if write and not entry.writable:
            # Readers of this store are open in this process (a notebook, a test): reopen the one
            # handle writable; the readers go through the entry and follow.
            entry.env.close()
            entry.env, entry.dbs = _open_writable_env(path, map_size)
            entry.writable = True
        entry.refs += 1
        return entry
    if write:
        entry = _EnvEntry(*_open_writable_env(path, map_size), True)
    else:
        env = _open_readonly_env(path, readahead)
        entry = _EnvEntry(env, _open_dbs_readonly(env), False)
    _ENVS[key] = entry
    return entry


def _check_complete(path: Path) -> None:
    """Refuse a store whose data.mdb is cut short before LMDB maps it (it would die of SIGBUS)."""
    short = truncation(path / DATA_NAME)
    if short:
        raise TruncatedStoreError(f"store {path}: {short}, so it is an incomplete copy; copy the store again "
                                  f"from its source (namsa stage SRC DST), or delete the directory {path} and run "
                                  f"namsa simulate (or namsa run) again, which simulates its samples anew")


def _open_writable_env(path: Path, map_size: int) -> tuple[lmdb.Environment, dict[bytes, Any]]:
    """The writable environment of ``path`` and its databases (created on first use)."""
    _check_complete(path)
    try:
        env = lmdb.open(str(path), map_size=map_size, max_dbs=len(_DBS), subdir=True,
                        readahead=False, meminit=False, max_spare_txns=1)
    except lmdb.Error as exc:
        raise _creation_error(path, exc) from exc
    try:
        return env, _open_dbs(env, create=True)
    except lmdb.Error as exc:
        env.close()
        raise _creation_error(path, exc) from exc


def _creation_error(path: Path, exc: lmdb.Error) -> StoreError | StoreFullError:
    """One line for a store that cannot be opened or created. LMDB reports a write cut short by a
    full disk or a file size limit as EIO, so an I/O error here is named as the likely full disk."""
    text = " ".join(str(exc).split())
    if _is_disk_full(exc) or os.strerror(errno.EIO).lower() in text.lower():
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        ulimit = f", or raise the file size limit (ulimit -f is {limit >> 10} KiB)" if limit != resource.RLIM_INFINITY else ""
        return StoreFullError(f"cannot create store {path}: the disk is full or a file size limit is reached "
                              f"({text}); free space there{ulimit} "
                              f"and run again, or write to a disk with room (--out, data.node_local_dir)")
    return StoreError(f"cannot open store {path} for writing: {text}; check the path and free disk space")


def _release_env(path: Path, entry: _EnvEntry) -> None:
    if entry.pid != os.getpid():
        return
    entry.refs -= 1
    if entry.refs <= 0:
        entry.env.close()
        if _ENVS.get(os.path.realpath(path)) is entry:
            del _ENVS[os.path.realpath(path)]


def _open_readonly_env(path: Path, readahead: bool = False) -> lmdb.Environment:
    """Lock-free when no writer is open (no reader table to update: cheapest, and works on
    read-only copies); with a writer open, LMDB's reader table (``lock=True``) so the writer never
    reuses pages of the snapshot this reader is reading (lock-free readers would read them torn)."""
    _check_complete(path)
    writer = writer_active(path)
    try:
        return lmdb.open(str(path), readonly=True, lock=writer is not None, readahead=readahead,
                         max_dbs=len(_DBS), subdir=True, max_spare_txns=1)
    except (PermissionError, lmdb.Error) as exc:
        denied = isinstance(exc, PermissionError) or "Permission denied" in str(exc)
        if denied and writer:
            raise StoreError(f"store {path} is being written ({writer}) and its lock.mdb is not writable by you, "
                             "so it cannot be read safely now; wait for the writer to finish (if that writer died, "
                             "open and close a StoreWriter on the store once to clear writer.lock)") from exc
        if denied:
            raise StoreError(f"permission denied reading store {path}; fix its permissions") from exc
        raise StoreError(f"cannot open store {path}: {exc}; is it a namsa store?") from exc


def _open_dbs_readonly(env: lmdb.Environment) -> dict[bytes, Any] | None:
    try:
        return _open_dbs(env, create=False)
    except lmdb.NotFoundError:
        return None  # killed before the first commit: an empty store
