"""`StoreSet`: several stores read as one sequence, and the `open_store` / `open_stores` helpers."""
from __future__ import annotations

import bisect
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from namsa.sample import Sample

from .errors import EmptyStoreError, SchemaError
from .layout import expand_store_paths
from .manifest import FORMAT_NAME, SCHEMA_VERSION
from .reader import StoreReader
from .splits import SPLITS
from .stats import merge_statistics
from .transforms import intensity_scale

_log = logging.getLogger(__name__)


def duplicate_ids(readers: Sequence[StoreReader]) -> dict[str, list[Path]]:
    """Sample ids held by more than one of ``readers``, each with the stores holding it (in order)."""
    where: dict[str, list[Path]] = {}
    for reader in readers:
        for sid in reader.ids():
            where.setdefault(sid, []).append(reader.path)
    return {sid: paths for sid, paths in where.items() if len(paths) > 1}


def _count_each_id_once(readers: list[StoreReader]) -> list[StoreReader]:
    """Hide every sample id a store shares with an earlier store (the first store wins), say so in
    one log line, and drop stores left empty."""
    duplicates = duplicate_ids(readers)
    if not duplicates:
        return readers
    seen: set[str] = set()
    for reader in readers:
        ids = set(reader.ids())
        reader.hide(ids & seen)
        seen |= ids
    first = next(iter(duplicates.items()))
    _log.warning(f"namsa: warning: {len(duplicates)} sample id(s) are stored in more than one store (e.g. "
                 f"{first[0]!r} in {[str(p) for p in first[1]]}); each is counted once, from the first store "
                 f"that holds it (namsa inspect --verify lists them)")
    return [r for r in readers if len(r)]


class StoreSet:
    """Several stores read as one sequence (concatenated in the order given); a sample id stored in
    more than one of them is counted once, from the first store that holds it."""

    def __init__(self, readers: Sequence[StoreReader]):
        self.readers = _count_each_id_once(list(readers))
        self._offsets = [0]
        for r in self.readers:
            self._offsets.append(self._offsets[-1] + len(r))
        shapes = {json.dumps(r.manifest["arrays"], sort_keys=True) for r in self.readers if len(r)}
        if len(shapes) > 1:
            raise SchemaError(f"stores {[str(r.path) for r in self.readers]} hold different array shapes/dtypes "
                              f"({sorted(shapes)}); read stores of one configuration together")

    @property
    def skipped(self) -> list[str]:
        return [k for r in self.readers for k in r.skipped]

    @property
    def intensity_scale(self) -> float:
        """The CBED intensity scale of these stores (`stage.transforms.intensity_scale` of P)."""
        return intensity_scale(self.readers[0].manifest["arrays"]["cbed"]["shape"][-1])

    @property
    def storage_scale(self) -> float:
        """The factor stored cbed values carry (1 for float32 stores; all stores agree, see __init__)."""
        return float(self.readers[0].manifest["arrays"]["cbed"].get("scale", 1.0))

    @property
    def manifests(self) -> list[dict[str, Any]]:
        return [r.manifest for r in self.readers]

    @property
    def manifest(self) -> dict[str, Any]:
        """A combined summary: count, counts per split, arrays, and each store's path."""
        counts = {s: sum(r.manifest["counts"][s] for r in self.readers) for s in SPLITS}
        return {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, "count": len(self), "counts": counts,
                "arrays": self.readers[0].manifest["arrays"] if self.readers else {},
                "stores": [str(r.path) for r in self.readers]}

    def __len__(self) -> int:
        return self._offsets[-1]

    def locate(self, i: int) -> tuple[StoreReader, int]:
        """(store, index inside it) of global index ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample index {i} out of range for {len(self)} samples in {len(self.readers)} stores")
        k = bisect.bisect_right(self._offsets, i) - 1
        return self.readers[k], i - self._offsets[k]

    def __getitem__(self, i: int) -> Sample:
        if i < 0:
            i += len(self)
        reader, j = self.locate(i)
        return reader[j]

    def __iter__(self) -> Iterator[Sample]:
        for reader in self.readers:
            yield from reader

    def ids(self, split: str | None = None) -> list[str]:
        return [sid for r in self.readers for sid in r.ids(split)]

    def indices(self, split: str | None = None) -> list[int]:
        return [off + j for off, r in zip(self._offsets, self.readers) for j in r.indices(split)]

    def store_ranges(self) -> list[range]:
        """Global index range of every store, in order."""
        return [range(a, b) for a, b in zip(self._offsets, self._offsets[1:])]

    def statistics(self, split: str) -> dict[str, Any]:
        return merge_statistics(r.statistics(split) for r in self.readers)

    def verify_all(self) -> list[str]:
        return [f"{r.path}:{k}" for r in self.readers for k in r.verify_all()]

    def describe(self) -> str:
        return f"stores {[str(r.path) for r in self.readers]}"

    def close(self) -> None:
        for r in self.readers:
            r.close()

    def __enter__(self) -> "StoreSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_store(path: str | os.PathLike, *, verify: bool = True, skip_corrupt: bool = False,
               allow_empty: bool = False, readahead: bool | None = None) -> StoreReader:
    """Open one store read-only (lock-free); see `StoreReader`."""
    return StoreReader(path, verify=verify, skip_corrupt=skip_corrupt, allow_empty=allow_empty,
                       readahead=readahead)


def open_stores(paths: str | os.PathLike | Sequence[str | os.PathLike], *, verify: bool = True,
                skip_corrupt: bool = False, readahead: bool | None = None) -> StoreSet:
    """Open several stores (or every store below data dirs) as one sequence; empty stores are skipped
    unless all are empty."""
    readers = [StoreReader(p, verify=verify, skip_corrupt=skip_corrupt, allow_empty=True, readahead=readahead)
               for p in expand_store_paths(paths)]
    if not any(len(r) for r in readers):
        raise EmptyStoreError(f"stores {[str(r.path) for r in readers]} hold no samples; run namsa simulate first")
    return StoreSet([r for r in readers if len(r)])
