"""Where stores live: the files of a store directory (format v1), and finding stores below a data dir.

Layout of a store directory (docs/store-format.md has the full description)::

    <store>/data.mdb, lock.mdb   LMDB environment with three named databases:
        records   sample id -> sealed binary record (stage.codec): cbed, potential, density, meta
        index     sample id -> sealed JSON {split, material_id, nbytes, stats}
        info      b"store"  -> sealed JSON {schema_version, config_hash, arrays, ...}
    <store>/manifest.json       human-readable summary, written atomically (temp + rename)
    <store>/writer.lock         flock'ed by the one writer allowed at a time; holds "<pid> <host>"
                                while it is open (emptied on close)

A record and its index entry are committed in one LMDB transaction, so a kill never leaves a
partial sample, and the manifest is always derivable from the LMDB contents: the writer rebuilds
it on open and on close, and readers reconcile it with the index.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from namsa.errors import UserError

from .errors import NotAStoreError, StoreNotFoundError

MANIFEST_NAME = "manifest.json"
LOCK_NAME = "writer.lock"
DATA_NAME = "data.mdb"


def is_store(path: str | os.PathLike) -> bool:
    return (Path(path) / DATA_NAME).is_file()


def find_stores(root: str | os.PathLike) -> list[Path]:
    """Every store (a directory holding data.mdb) at or below ``root``, sorted by path."""
    root = Path(root)
    if not root.exists():
        raise StoreNotFoundError(f"data directory {root} does not exist; check the path or run namsa simulate")
    if is_store(root):
        return [root]
    return sorted(p.parent for p in root.rglob(DATA_NAME) if p.is_file())


def expand_store_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Store directories named by ``paths``: each entry is a store or a data dir holding stores."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    for p in paths:
        stores = find_stores(p)
        if not stores:
            raise NotAStoreError(f"{p} is not a store and contains none; point at a data directory written "
                                 f"by namsa simulate")
        found.extend(stores)
    if not found:
        raise UserError("no store paths given; pass one or more store or data directories")
    return found
