"""`StoreReader`: the read-only, lock-free view of one store, and copying records out of the map."""
from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import xxhash

from namsa.errors import UserError
from namsa.sample import Sample, SampleMeta
from namsa.sample_meta import SampleMetaError

from . import codec
from .errors import (CorruptRecordError, EmptyStoreError, NotAStoreError, SchemaError, StoreError,
                     StoreNotFoundError)
from .layout import DATA_NAME, MANIFEST_NAME, find_stores, is_store
from .lmdbenv import _acquire_env, _EnvEntry, _release_env
from .manifest import _check_schema_version, _load_manifest, _read_info_and_index, build_manifest

ARRAY_NAMES: tuple[str, ...] = ("cbed", "potential", "density")

#: mean record size from which readers keep kernel readahead on (see `StoreReader`).
READAHEAD_MIN_RECORD_BYTES = 1 << 20


@functools.lru_cache(maxsize=8)
def _float16_table(scale: float) -> np.ndarray:
    """The float32 value of every float16 bit pattern divided by the storage ``scale``, each computed as
    `_copy_out`'s cast and multiply compute it (so a look-up gives the same bits)."""
    table = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore"):   # the NaN patterns stay NaN
        table = np.multiply(table, np.float32(1.0 / scale)) if scale != 1.0 else table
    table.flags.writeable = False   # shared by every read (cached)
    return table


def _by_table(view: np.ndarray, dtype: Any, out: np.ndarray | None, scale: float) -> bool:
    """Whether `_copy_out` casts float16 ``view`` to float32 by `_float16_table` look-up: numpy's own cast
    slows down ~5x on subnormal values, 40% of a study store's stored cbed (4.8 ms against 1.0 ms a
    1024 x 32 x 32 stack on a 2-core EPYC VM); the look-up gives the same bits at any value."""
    cast = np.dtype(dtype if dtype is not None else view.dtype)
    target = out.dtype if out is not None else np.dtype(np.float32) if scale != 1.0 else cast
    contiguous = view.flags.c_contiguous and (out is None or out.flags.c_contiguous)
    return view.dtype == np.float16 and target == np.float32 and contiguous


def _copy_out(view: np.ndarray, dtype: Any, out: np.ndarray | None, scale: float) -> np.ndarray:
    """Copy ``view`` out of the LMDB map, cast to ``dtype``; ``scale != 1`` divides by the storage
    scale (a power of two, so exact) and yields float32 physical intensities."""
    if _by_table(view, dtype, out, scale):
        out = out if out is not None else np.empty(view.shape, np.float32)
        np.take(_float16_table(scale), view.view(np.uint16), out=out, mode="clip")
        return out
    if scale != 1.0:
        out = out if out is not None else np.empty(view.shape, np.float32)
        np.multiply(view, np.float32(1.0 / scale), out=out, casting="unsafe")
        return out
    if out is not None:
        np.copyto(out, view, casting="unsafe")
        return out
    return view.astype(dtype) if dtype is not None else view.copy()


def _copy_out_verified(raw: Any, rec: codec.DecodedRecord, dtype: Any, out: dict[str, np.ndarray],
                       scales: dict[str, float], chunk_bytes: int = 1 << 20) -> dict[str, np.ndarray] | None:
    """`_copy_out` of every array of ``rec`` while hashing the sealed record ``raw`` in order,
    ~1 MiB at a time, each piece hashed right after it was copied (still in cache): one pass over
    memory instead of two. None if the checksum does not match (``out`` then holds garbage)."""
    view = memoryview(raw)
    end = len(view) - 8
    hasher = xxhash.xxh3_64()
    pos = 0
    arrays = {}
    entries = sorted((e for e in rec.header["arrays"] if e["name"] in rec.arrays), key=lambda e: e["offset"])
    for e in entries:
        a = rec.arrays[e["name"]]
        hasher.update(view[pos: e["offset"]])
        row_bytes = max(1, a[0].nbytes if a.ndim and len(a) else 1)
        rows = max(1, chunk_bytes // row_bytes) if a.ndim else 1
        dst = out.get(e["name"])
        if dst is None or a.ndim == 0:
            arrays[e["name"]] = _copy_out(a, dtype, dst, scales[e["name"]])
            hasher.update(view[e["offset"]: e["offset"] + e["nbytes"]])
        else:
            for r in range(0, len(a), rows):
                _copy_out(a[r: r + rows], dtype, dst[r: r + rows], scales[e["name"]])
                hasher.update(view[e["offset"] + r * row_bytes: e["offset"] + min(len(a), r + rows) * row_bytes])
            arrays[e["name"]] = dst
        pos = e["offset"] + e["nbytes"]
    hasher.update(view[pos:end])
    (stored,) = struct.unpack("<Q", view[end:])
    return arrays if hasher.intdigest() == stored else None


def _sample_meta(store: str, sid: str, data: Any) -> SampleMeta:
    """The typed meta of a record's stored JSON; a meta without its scan is a `CorruptRecordError`."""
    try:
        return SampleMeta.from_json(data)
    except SampleMetaError as exc:
        raise CorruptRecordError(store, sid, str(exc)) from None


class StoreReader:
    """Read-only, lock-free view of one store; safe to pickle into DataLoader workers.

    ``len``, ``[i] -> Sample`` (sorted by sample id), iteration, ``.manifest``, ``.ids(split)``.
    Every record's checksum is verified on read (``verify=True``). With ``skip_corrupt=True``
    iteration skips corrupt records and lists them in ``.skipped``; indexing still raises
    `CorruptRecordError` naming the store and the key.

    ``readahead`` (None = automatic): kernel readahead on the memory map. Off for stores of
    small records (random access should not drag neighbours into the cache); on when the mean
    record is >= 1 MiB, because py-lmdb prefaults every page of a value on ``get`` and, with
    readahead off, each 4 KiB page is then a separate synchronous disk read (measured ~40 MB/s
    cold against ~1 GB/s sequential for 128 MiB records; benchmarks/RESULTS.md).
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True, skip_corrupt: bool = False,
                 allow_empty: bool = False, readahead: bool | None = None):
        self.path = Path(path)
        self.verify = verify
        self.skip_corrupt = skip_corrupt
        self.skipped: list[str] = []
        self._entry: _EnvEntry | None = None
        self._pid = -1
        self.readahead = readahead
        try:
            self._check_path()
            if self.readahead is None:
                self.readahead = self._records_are_large()
            self.manifest, self.reconciled = self._load_and_reconcile()
        except PermissionError as exc:
            raise StoreError(f"permission denied reading store {self.path} ({exc.filename}); fix its "
                             f"permissions") from exc
        self._list_samples()
        if not self._ids and not allow_empty:
            raise EmptyStoreError(f"store {self.path} holds no samples; run namsa simulate into it first "
                                  f"(or remove the empty directory)")
        if self._ids and not self.readahead:
            # small records: check the first one now (large ones are checked on every read
            # anyway, and a get prefaults the whole value)
            self._check_first_record()

    def _list_samples(self) -> None:
        self._ids = [s["id"] for s in self.manifest["samples"]]
        self._keys = [sid.encode() for sid in self._ids]
        self._position = {sid: i for i, sid in enumerate(self._ids)}
        self._splits = [s["split"] for s in self.manifest["samples"]]

    def hide(self, sample_ids: set[str]) -> None:
        """Leave ``sample_ids`` out of this reader (its length, ids, indices and manifest): how a
        `StoreSet` counts a sample stored in two stores once."""
        self._index = {sid: entry for sid, entry in self._index.items() if sid not in sample_ids}
        self.manifest = build_manifest(self.path, self.info, self._index)
        self._list_samples()

    def _check_path(self) -> None:
        path = self.path
        if not path.exists():
            raise StoreNotFoundError(f"no store at {path}: the path does not exist; check it or run namsa simulate")
        if not path.is_dir() or not is_store(path):
            inner = find_stores(path) if path.is_dir() else []
            hint = (f"it contains {len(inner)} stores: use stage.open_stores(stage.find_stores('{path}'))"
                    if inner else "point at a directory written by namsa simulate")
            raise NotAStoreError(f"{path} is not a store (no {DATA_NAME}); {hint}")
        if not os.access(path / DATA_NAME, os.R_OK):
            raise StoreError(f"permission denied reading store {path}; fix its permissions")

    def _records_are_large(self) -> bool:
        if not (self.path / MANIFEST_NAME).exists():
            return False
        manifest = _load_manifest(self.path)
        count = manifest.get("count") or 0
        return count > 0 and manifest.get("bytes", 0) / count >= READAHEAD_MIN_RECORD_BYTES

    def _load_and_reconcile(self) -> tuple[dict[str, Any], bool]:
        on_disk = _load_manifest(self.path) if (self.path / MANIFEST_NAME).exists() else None
        if on_disk is not None:
            _check_schema_version(self.path, on_disk.get("schema_version"), MANIFEST_NAME)
        env = self.env
        dbs = self._dbs
        info, index = _read_info_and_index(env, dbs, self.path) if dbs is not None else ({}, {})
        if info:
            _check_schema_version(self.path, info.get("schema_version"), "LMDB info")
        derived = build_manifest(self.path, info, index)
        self.info, self._index = info, index
        if on_disk is None:
            return derived, True
        listed = {s["id"] for s in on_disk.get("samples", [])}
        missing = sorted(listed - set(index))
        if missing:
            raise SchemaError(f"store {self.path}: manifest lists {len(missing)} samples missing from LMDB "
                              f"(e.g. {missing[0]!r}); the manifest belongs to another store: delete it "
                              f"to rebuild it from the records")
        if index and on_disk.get("arrays") and on_disk["arrays"] != derived["arrays"]:
            raise SchemaError(f"store {self.path}: manifest arrays {on_disk.get('arrays')} disagree with the "
                              f"records {derived['arrays']}; delete manifest.json to rebuild it from the records")
        # A kill between a commit and the manifest refresh leaves the manifest behind the records:
        # the LMDB contents are the truth.
        return derived, listed != set(index)

    @property
    def env(self) -> lmdb.Environment:
        # One environment per process: LMDB handles must not cross fork().
        if self._entry is None or self._pid != os.getpid():
            self._entry = _acquire_env(self.path, write=False, readahead=bool(self.readahead))
            self._pid = os.getpid()
        return self._entry.env

    @property
    def _dbs(self) -> dict[bytes, Any] | None:
        self.env  # noqa: B018 (opens the environment in this process if needed)
        return self._entry.dbs

    def _txn(self) -> lmdb.Transaction:
        """A read transaction. LMDB refuses to begin one (MapResizedError) when a writer has grown
        the file beyond this process's map since it was opened: adopt the new size and begin again."""
        try:
            return self.env.begin(buffers=True)
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)
            return self.env.begin(buffers=True)

    def _check_first_record(self) -> None:
        with self._txn() as txn:
            raw = txn.get(self._keys[0], db=self._dbs[b"records"])
            if raw is None:
                raise SchemaError(f"store {self.path}: index lists {self._ids[0]!r} but it has no record")
            try:
                header = codec.decode_record(raw, verify=False, names=()).header
            except codec.RecordCorrupt as exc:
                raise CorruptRecordError(str(self.path), self._ids[0], str(exc)) from exc
            self._check_header(self._ids[0], header)

    def _check_header(self, sid: str, header: dict[str, Any]) -> None:
        found = codec.array_layout(header)
        if found != self.manifest["arrays"]:
            raise SchemaError(f"store {self.path}: record {sid!r} holds arrays {found} but the manifest "
                              f"says {self.manifest['arrays']}; the store is inconsistent: re-stage it")

    # -- access ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ids)

    def ids(self, split: str | None = None) -> list[str]:
        return [sid for sid, s in zip(self._ids, self._splits) if split is None or s == split]

    def indices(self, split: str | None = None) -> list[int]:
        return [i for i, s in enumerate(self._splits) if split is None or s == split]

    def split(self, i: int) -> str:
        return self._splits[i]

    def read_arrays(self, i: int, names: Sequence[str] = ARRAY_NAMES, dtype: Any = None,
                    verify: bool | None = None, out: dict[str, np.ndarray] | None = None,
                    physical: bool = True) -> tuple[dict[str, np.ndarray], SampleMeta]:
        """Arrays ``names`` of sample ``i`` (copied out of the map, cast to ``dtype`` if given) + its
        `SampleMeta` (the stored JSON read into the record: this is where a store's meta becomes typed).

        ``physical``: undo the storage scale of float16 cbed (float32 intensities, total 1 per
        pattern); False returns the values as stored (see `stage.transforms.intensity_scale`).
        ``out`` maps names to preallocated arrays of the right shape to copy (and cast) into, so
        the loader moves each byte from the page cache once, straight into its buffer; with
        ``out`` and ``verify`` the checksum is computed piecewise during that copy (one pass
        over memory; `_copy_out_verified`) and a mismatch raises before anything is returned.
        """
        sid = self._ids[i]
        verify = self.verify if verify is None else verify
        with self._txn() as txn:
            raw = txn.get(self._keys[i], db=self._dbs[b"records"])
            if raw is None:
                raise CorruptRecordError(str(self.path), sid, "record missing from LMDB")
            fused = verify and out is not None
            try:
                # with ``out``, the checksum is computed while copying (one pass over memory)
                rec = codec.decode_record(raw, verify=verify and not fused, names=tuple(names))
                if fused and any(e["codec"] == "zstd-shuffle" for e in rec.header["arrays"]):
                    fused, rec = False, codec.decode_record(raw, verify=True, names=tuple(names))
            except codec.RecordCorrupt as exc:
                if fused:  # unparseable: let the checksum name the cause
                    fused = False
                    try:
                        codec.unseal(raw)
                    except codec.RecordCorrupt as sealed:
                        raise CorruptRecordError(str(self.path), sid, str(sealed)) from exc
                raise CorruptRecordError(str(self.path), sid, str(exc)) from exc
            scales = {e["name"]: e.get("scale", 1.0) if physical else 1.0 for e in rec.header["arrays"]}
            if fused:
                arrays = _copy_out_verified(raw, rec, dtype, out, scales)
                if arrays is None:
                    raise CorruptRecordError(str(self.path), sid, "checksum mismatch")
            self._check_header(sid, rec.header)
            if not fused:
                # Copy (or cast) inside the transaction: the views die with it.
                arrays = {n: _copy_out(a, dtype, (out or {}).get(n), scales[n]) for n, a in rec.arrays.items()}
        return arrays, _sample_meta(str(self.path), sid, rec.meta)

    def read_raw(self, i: int, verify: bool = True) -> tuple[bytearray, dict[str, Any]]:
        """The sealed record bytes of sample ``i`` (checksum verified) and its index entry."""
        sid = self._ids[i]
        with self._txn() as txn:
            view = txn.get(self._keys[i], db=self._dbs[b"records"])
            if view is None:
                raise CorruptRecordError(str(self.path), sid, "record missing from LMDB")
            # a numpy copy releases the GIL, so reader threads fault pages in in parallel
            record = bytearray(len(view))
            np.copyto(np.frombuffer(record, dtype=np.uint8), np.frombuffer(view, dtype=np.uint8))
        if verify:
            try:
                codec.unseal(record)
            except codec.RecordCorrupt as exc:
                raise CorruptRecordError(str(self.path), sid, str(exc)) from exc
        return record, self._index[sid]

    def __getitem__(self, i: int) -> Sample:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample index {i} out of range for store {self.path} with {len(self)} samples")
        arrays, meta = self.read_arrays(i % len(self))
        return Sample(cbed=arrays["cbed"], potential=arrays["potential"], density=arrays["density"], meta=meta)

    def meta(self, i: int) -> SampleMeta:
        """The `SampleMeta` of sample ``i`` (checksum verified) without copying its arrays out."""
        return self.read_arrays(i, names=())[1]

    def get(self, sample_id: str) -> Sample:
        if sample_id not in self._position:
            raise UserError(f"store {self.path} has no sample {sample_id!r}")
        return self[self._position[sample_id]]

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            try:
                yield self[i]
            except CorruptRecordError:
                if not self.skip_corrupt:
                    raise
                self.skipped.append(self._ids[i])

    def verify_all(self) -> list[str]:
        """Keys of every record that fails its checksum or disagrees with the manifest."""
        bad = []
        for i, sid in enumerate(self._ids):
            try:
                self.read_arrays(i, names=(), verify=True)
            except (CorruptRecordError, SchemaError):
                bad.append(sid)
        return bad

    def statistics(self, split: str) -> dict[str, Any]:
        return self.manifest["statistics"][split]

    def describe(self) -> str:
        return f"store {self.path}"

    def close(self) -> None:
        if self._entry is not None and self._pid == os.getpid():
            _release_env(self.path, self._entry)
        self._entry = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_entry"] = None
        state["_pid"] = -1
        return state

    def __enter__(self) -> "StoreReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreReader({str(self.path)!r}, {len(self)} samples)"
