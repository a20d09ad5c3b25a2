"""Exactly once per data directory: claims that let several store writers share one data directory.

Every writer has its own store (stage.writer), so two writers whose plans overlap (two
`namsa simulate --worker i --of N` with different N on one ``--out``) would each store the same
sample. Before simulating a sample, a writer claims its id in the data directory:

    <data_dir>/.claims.lock        flock'ed while a claim is checked and written (milliseconds)
    <data_dir>/.claims/<h>         one file per sample id (h = sha256 of the id), holding
                                   {"id", "store", "pid", "host"}

A claim held by another store is respected while that store holds the sample or while the writer
that made it is still open (`stage.writerlock.writer_active` names the same pid); a claim of a writer
that died before storing the sample is stale and taken over, and so is a claim whose store no longer
holds the sample (the store was deleted, as the truncated-store message advises): what a store holds
is read from the store, never trusted from a claim.
The LMDB records stay the truth: a claim only decides who writes, never whether a sample exists.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterator

from .errors import StoreError
from .layout import LOCK_NAME
from .writerlock import _lock_holder, writer_active

CLAIMS_DIR = ".claims"
CLAIMS_LOCK = ".claims.lock"


class ClaimBook:
    """The claims of one data directory, made on behalf of the writer of ``store`` (a child of it)."""

    def __init__(self, store: str | os.PathLike):
        self.store = Path(store)
        self.data_dir = self.store.parent
        self.dir = self.data_dir / CLAIMS_DIR
        self._seen: dict[str, set[str]] = {}  # store name -> ids it held when last read
        for link in (self.dir, self.data_dir / CLAIMS_LOCK):
            if link.is_symlink():  # claims are written (and killed writers' files removed) only here
                raise StoreError(f"{link} is a symbolic link to {os.readlink(link)}; namsa writes claims only "
                                 f"inside the data directory: remove the link and run again")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.dir} ({exc.strerror}); the data directory must be writable "
                             f"by every simulation worker") from exc
        with self._locked():  # claims are written under the lock: a temporary file now is a killed writer's
            for tmp in self.dir.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)

    def _file(self, sample_id: str) -> Path:
        return self.dir / hashlib.sha256(sample_id.encode()).hexdigest()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.data_dir / CLAIMS_LOCK, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # held for a read and a small write: never long
            yield

    def claim(self, sample_id: str) -> str | None:
        """Claim ``sample_id`` for this store: None when it is ours to write, else why not (it is
        stored in, or being written by, another store of the data directory)."""
        with self._locked():
            found = _read(self._file(sample_id))
            if found and found.get("id") == sample_id and found.get("store") != self.store.name:
                why = self._still_valid(found)
                if why:
                    return why
            self._write(sample_id)
        return None

    def _still_valid(self, claim: dict[str, Any]) -> str | None:
        other = self.data_dir / str(claim["store"])
        if self._holds(other, claim["id"]):  # asked of the store itself: it may have been deleted
            return f"already stored in {other.name}"
        active = writer_active(other)
        holder = _lock_holder((other / LOCK_NAME).read_text()) if active else None
        if holder is not None and holder == (claim.get("pid"), claim.get("host")):
            return f"being written into {other.name} by {active}"
        return None  # its writer is gone without storing it: a stale claim

    def _holds(self, store: Path, sample_id: str) -> bool:
        """Whether ``store`` holds ``sample_id``; its ids are read again only on a miss (a store's ids
        only grow while a run goes on, so a rerun with another split reads each store about once)."""
        if sample_id in self._seen.get(store.name, ()):
            return True
        self._seen[store.name] = _store_ids(store)
        return sample_id in self._seen[store.name]

    def _write(self, sample_id: str) -> None:
        path = self._file(sample_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"id": sample_id, "store": self.store.name, "pid": os.getpid(),
                                   "host": socket.gethostname()}))
        os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None  # a damaged claim decides nothing: the records are the truth
    return payload if isinstance(payload, dict) and "store" in payload else None


def _store_ids(path: Path) -> set[str]:
    """The ids committed in the store at ``path``; none when it is gone or unreadable (a damaged
    store's claims are taken over: its user is told to delete it)."""
    from .layout import is_store
    from .reader import StoreReader

    if not is_store(path):
        return set()
    try:
        with StoreReader(path, allow_empty=True) as reader:
            return set(reader.ids())
    except StoreError:
        return set()
