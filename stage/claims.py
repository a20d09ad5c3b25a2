"""Exactly once per data directory: claims that let several store writers share one data directory.

Every writer has its own store (stage.writer), so two writers whose plans overlap (two
`namsa simulate --worker i --of N` with different N on one ``--out``) would each store the same
sample. Before simulating a sample, a writer claims its id in the data directory:

    <data_dir>/.claims.lock        flock'ed while a claim is checked and written (milliseconds)
    <data_dir>/.claims/<h>         one file per sample id (h = sha256 of the id), holding
                                   {"id", "store", "pid", "host", "stored"}

A claim held by another store is respected while that store holds the sample ("stored") or while
the writer that made it is still open (`stage.writerlock.writer_active` names the same pid); a claim of
a writer that died before storing the sample is stale and taken over. The LMDB records stay the
truth: a claim only decides who writes, never whether a sample exists.
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
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.dir} ({exc.strerror}); the data directory must be writable "
                             f"by every simulation worker") from exc

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
            self._write(sample_id, stored=False)
        return None

    def stored(self, sample_id: str) -> None:
        """Mark ``sample_id`` as stored by this store (after its transaction committed)."""
        with self._locked():
            self._write(sample_id, stored=True)

    def _still_valid(self, claim: dict[str, Any]) -> str | None:
        other = self.data_dir / str(claim["store"])
        if claim.get("stored") or _store_holds(other, claim["id"]):
            return f"already stored in {other.name}"
        active = writer_active(other)
        holder = _lock_holder((other / LOCK_NAME).read_text()) if active else None
        if holder is not None and holder == (claim.get("pid"), claim.get("host")):
            return f"being written into {other.name} by {active}"
        return None  # its writer is gone without storing it: a stale claim

    def _write(self, sample_id: str, stored: bool) -> None:
        path = self._file(sample_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"id": sample_id, "store": self.store.name, "pid": os.getpid(),
                                   "host": socket.gethostname(), "stored": stored}))
        os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None  # a damaged claim decides nothing: the records are the truth
    return payload if isinstance(payload, dict) and "store" in payload else None


def _store_holds(path: Path, sample_id: str) -> bool:
    """Whether the store at ``path`` has ``sample_id`` committed (a writer killed between its commit
    and marking the claim leaves the claim unmarked)."""
    from .layout import is_store
    from .reader import StoreReader

    if not is_store(path):
        return False
    try:
        with StoreReader(path, allow_empty=True) as reader:
            return sample_id in reader.ids()
    except StoreError:
        return False
