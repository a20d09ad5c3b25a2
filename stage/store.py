"""Store format v1: one LMDB environment per writer, checksummed records, a JSON manifest beside it.

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

import bisect
import errno
import fcntl
import json
import logging
import os
import resource
import shutil
import socket
import tempfile
import struct
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import xxhash

from namsa.errors import UserError
from namsa.sample import Sample

from . import codec
from .config import DataConfig
from .errors import (CorruptRecordError, EmptyStoreError, NotAStoreError, SchemaError, StoreError,
                     StoreFullError, StoreLockedError, StoreNotFoundError, TruncatedStoreError)
from .lmdbfile import truncation
from .normalize import intensity_scale, merge_statistics, sample_statistics
from .splits import SPLITS, split_of

SCHEMA_VERSION = 1
FORMAT_NAME = "namsa-store"
MANIFEST_NAME = "manifest.json"
LOCK_NAME = "writer.lock"
DATA_NAME = "data.mdb"
ARRAY_NAMES: tuple[str, ...] = ("cbed", "potential", "density")
_DBS = (b"records", b"index", b"info")
_INFO_KEY = b"store"
#: errno values that mean "the disk is full" (EFBIG: a file-size limit, e.g. RLIMIT_FSIZE or quota).
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_log = logging.getLogger(__name__)


def code_version() -> str:
    try:
        return metadata.version("namsa")
    except metadata.PackageNotFoundError:
        return "unknown"


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


# --------------------------------------------------------------------------------------------
# small helpers

def _json_seal(obj: Any) -> bytes:
    return codec.seal(json.dumps(obj, separators=(",", ":"), sort_keys=True).encode())


def _json_unseal(buf: bytes | memoryview) -> Any:
    return json.loads(bytes(codec.unseal(buf)))


def _write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temp file in the same directory, fsync, rename over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; a manifest on a shared filesystem must be readable by every user.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
        return True
    text = str(exc).lower()
    return any(os.strerror(e).lower() in text for e in _DISK_FULL_ERRNOS)


def _check_schema_version(path: Path, version: Any, where: str) -> None:
    if not isinstance(version, int):
        raise SchemaError(f"store {path}: {where} has no integer schema_version; it was not written by namsa")
    if version > SCHEMA_VERSION:
        raise SchemaError(f"store {path} was written with store schema v{version} but this namsa reads up to "
                          f"v{SCHEMA_VERSION}; upgrade namsa to read it")


def build_manifest(path: Path, info: dict[str, Any], index: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest of a store, derived entirely from its LMDB info and index databases."""
    ids = sorted(index)
    counts = {s: 0 for s in SPLITS}
    per_split: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for sid in ids:
        entry = index[sid]
        counts[entry["split"]] += 1
        per_split[entry["split"]].append(entry["stats"])
    return {
        "format": FORMAT_NAME,
        "schema_version": info.get("schema_version", SCHEMA_VERSION),
        "code_version": info.get("code_version", code_version()),
        "config_hash": info.get("config_hash"),
        "cbed_dtype": info.get("cbed_dtype"),
        "compression": info.get("compression"),
        "checksum": codec.CHECKSUM_NAME,
        "arrays": info.get("arrays", {}),
        "split_fractions": info.get("split_fractions"),
        "split_seed": info.get("split_seed"),
        "count": len(ids),
        "counts": counts,
        "bytes": int(sum(index[s]["nbytes"] for s in ids)),
        "samples": [{"id": sid, "split": index[sid]["split"], "material_id": index[sid]["material_id"]}
                    for sid in ids],
        "statistics": {s: merge_statistics(per_split[s]) for s in SPLITS},
        "intensity_scale": (intensity_scale(info["arrays"]["cbed"]["shape"][-1])
                            if info.get("arrays") else None),
        "created": info.get("created"),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _read_info_and_index(env: lmdb.Environment, dbs: dict[bytes, Any], path: Path
                         ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    with env.begin(buffers=True) as txn:
        raw_info = txn.get(_INFO_KEY, db=dbs[b"info"])
        try:
            info = _json_unseal(raw_info) if raw_info is not None else {}
        except (codec.RecordCorrupt, ValueError) as exc:
            raise CorruptRecordError(str(path), "info", str(exc)) from exc
        index = {}
        for key, value in txn.cursor(db=dbs[b"index"]):
            sid = bytes(key).decode()
            try:
                index[sid] = _json_unseal(value)
            except (codec.RecordCorrupt, ValueError) as exc:
                raise CorruptRecordError(str(path), f"index/{sid}", str(exc)) from exc
    return info, index


def _open_dbs(env: lmdb.Environment, create: bool) -> dict[bytes, Any]:
    return {name: env.open_db(name, create=create) for name in _DBS}


# --------------------------------------------------------------------------------------------
# one LMDB environment per (process, store)

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
                                  f"from its source (namsa stage SRC DST), or delete it and run namsa simulate again")


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


def _creation_error(path: Path, exc: lmdb.Error) -> StoreError:
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


def _scaled_float16(cbed: np.ndarray, scale: np.float32, chunk_values: int = 1 << 22) -> np.ndarray:
    """float16(cbed * scale), checked for NaN/inf/overflow, a few patterns at a time so the
    float32 temporary stays small and hot in cache (a whole-stack temporary is 256 MiB-1 GiB)."""
    out = np.empty(cbed.shape, np.float16)
    step = max(1, chunk_values // max(1, int(np.prod(cbed.shape[1:]))))
    tmp = np.empty((min(step, len(cbed)), *cbed.shape[1:]), np.float32)
    for start in range(0, len(cbed), step):
        part = tmp[: len(cbed[start: start + step])]
        np.multiply(cbed[start: start + step], scale, out=part)
        codec.check_float16_safe("cbed", part)
        out[start: start + step] = part
    return out


# --------------------------------------------------------------------------------------------
# writer

class StoreWriter:
    """Exactly-once, crash-safe writer of one store (one LMDB environment, one process).

    ``put(sample)`` commits the record and its index entry in one transaction and returns False if
    the sample id is already present, so re-running a simulation is a no-op for finished samples.
    The map grows automatically (doubling, up to ``data_cfg.max_map_size_gb``); a full disk raises
    `StoreFullError` and leaves every committed sample intact. A second writer on the same
    directory is refused (``flock`` on writer.lock).
    """

    def __init__(self, path: str | os.PathLike, *, config_hash: str, data_cfg: DataConfig | None = None,
                 resume: bool = True):
        if not isinstance(config_hash, str) or not config_hash:
            raise UserError("StoreWriter needs config_hash (a non-empty string, SimulationConfig.physics_hash())")
        self.path = Path(path)
        self.config_hash = config_hash
        self.cfg = data_cfg if data_cfg is not None else DataConfig()
        self._env: lmdb.Environment | None = None
        self._lock_fh = None
        self._last_manifest = 0.0
        self._dirty = False
        try:
            self._prepare_directory()
        except PermissionError as exc:
            raise StoreError(f"permission denied writing store {self.path} ({exc.filename}); fix its "
                             f"permissions or choose another directory") from exc
        self._lock()
        try:
            self._open_env()
            self.info, self._index = self._load_or_create_info()
            if self._index and not resume:
                raise StoreError(f"store {self.path} already holds {len(self._index)} samples and resume=False; "
                                 f"pass resume=True to continue it or choose a new directory")
            self.write_manifest()
        except BaseException:
            self.close()
            raise

    # -- opening ---------------------------------------------------------------------------
    def _prepare_directory(self) -> None:
        path = self.path
        if path.exists() and not path.is_dir():
            raise NotAStoreError(f"store path {path} is a file, not a directory; choose a directory for the store")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except PermissionError as exc:
            raise StoreError(f"permission denied creating store directory {path}; choose a writable "
                             f"directory (data.node_local_dir or --out)") from exc
        except OSError as exc:
            raise StoreError(f"cannot create store directory {path}: {exc.strerror}; choose another path") from exc
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"permission denied: store directory {path} is not writable; fix its "
                             f"permissions or choose another directory")
        if not is_store(path):
            stray = [p.name for p in path.iterdir() if p.name not in (LOCK_NAME, "lock.mdb")]
            if stray:
                raise NotAStoreError(f"{path} is not empty and is not a store (found {stray[:3]}); "
                                     f"write the store into an empty or new directory")
        if (path / MANIFEST_NAME).exists():
            manifest = _load_manifest(path)
            _check_schema_version(path, manifest.get("schema_version"), MANIFEST_NAME)

    def _lock(self) -> None:
        try:
            fh = open(self.path / LOCK_NAME, "a+")
        except PermissionError as exc:
            raise StoreError(f"permission denied opening {self.path / LOCK_NAME}; fix the store's permissions") from exc
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = _lock_holder(fh.read())
            fh.close()
            who = f"pid {holder[0]} on {holder[1]}" if holder else "pid unknown"
            raise StoreLockedError(f"store {self.path} is already open by another writer ({who}); "
                                   f"give every writer its own store directory") from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()} {socket.gethostname()}")
            fh.flush()
        except OSError as exc:  # readers must see that a writer is open: no lock without its holder
            fh.close()
            raise _creation_error(self.path, lmdb.Error(f"{self.path / LOCK_NAME}: {exc.strerror}")) from exc
        self._lock_fh = fh

    def _open_env(self) -> None:
        data_file = self.path / DATA_NAME
        size = data_file.stat().st_size if data_file.exists() else 0
        self._entry = _acquire_env(self.path, write=True, map_size=max(self.cfg.map_size_mb << 20, size))
        self._env = self._entry.env
        self._dbs = self._entry.dbs

    def _load_or_create_info(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        info, index = _read_info_and_index(self._env, self._dbs, self.path)
        if not info:
            info = {"schema_version": SCHEMA_VERSION, "config_hash": self.config_hash,
                    "cbed_dtype": self.cfg.cbed_dtype, "compression": self.cfg.compression,
                    "split_fractions": list(self.cfg.split_fractions), "split_seed": self.cfg.split_seed,
                    "code_version": code_version(), "arrays": {},
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._commit([(b"info", _INFO_KEY, _json_seal(info))])
            return info, index
        _check_schema_version(self.path, info.get("schema_version"), "LMDB info")
        for key, wanted in (("config_hash", self.config_hash), ("cbed_dtype", self.cfg.cbed_dtype),
                            ("split_fractions", list(self.cfg.split_fractions)),
                            ("split_seed", self.cfg.split_seed)):
            if info.get(key) != wanted:
                raise SchemaError(f"store {self.path} was written with {key}={info.get(key)!r}, not {wanted!r}; "
                                  f"resume with the same configuration or use a new directory")
        return info, index

    # -- writing ---------------------------------------------------------------------------
    def has(self, sample_id: str) -> bool:
        return sample_id in self._index

    def __len__(self) -> int:
        return len(self._index)

    def put(self, sample: Sample) -> bool:
        """Store ``sample`` (validated) in one transaction; False if its id is already present."""
        self._require_open()
        sample.validate()
        sid = sample.id
        if self.has(sid):
            return False
        key = sid.encode()
        if not 0 < len(key) <= 480:
            raise UserError(f"sample id {sid[:60]!r} is {len(key)} bytes; LMDB keys hold at most 480")
        if sample.meta.get("config_hash") != self.config_hash:
            raise UserError(f"sample {sid} has config_hash {sample.meta.get('config_hash')!r} but store "
                            f"{self.path} holds config {self.config_hash!r}; write it to its own store")
        arrays, scales = self._stored_arrays(sample)
        shapes = {name: {"dtype": a.dtype.str, "shape": list(a.shape), "scale": scales.get(name, 1.0)}
                  for name, a in arrays.items()}
        if self.info["arrays"] and self.info["arrays"] != shapes:
            # checked before the (costly) encoding; put_record checks again for raw records
            raise SchemaError(f"sample {sid} has arrays {shapes} but store {self.path} holds "
                              f"{self.info['arrays']}; all samples of a store share shapes and dtypes")
        codecs = {"cbed": "zstd-shuffle"} if self.cfg.compression == "zstd" else {}
        record = codec.encode_record(arrays, sample.meta, codecs, self.cfg.compression_level, scales)
        split = split_of(str(sample.meta["material_id"]), self.cfg.split_fractions, self.cfg.split_seed)
        stats_scale = intensity_scale(arrays["cbed"].shape[-1]) / scales["cbed"]
        entry = {"split": split, "material_id": str(sample.meta["material_id"]), "nbytes": len(record),
                 "stats": sample_statistics(arrays["cbed"], {k: arrays[k] for k in ("potential", "density")},
                                            scale=stats_scale)}
        return self.put_record(sid, record, entry, shapes)

    def put_record(self, sample_id: str, record: bytes | bytearray, entry: dict[str, Any],
                   arrays: dict[str, dict[str, Any]]) -> bool:
        """Commit an already encoded, sealed record with its index entry (used by staging, which
        copies records verbatim); ``arrays`` are the record's names/dtypes/shapes."""
        self._require_open()
        if self.has(sample_id):
            return False
        if self.info["arrays"] and self.info["arrays"] != arrays:
            raise SchemaError(f"sample {sample_id} has arrays {arrays} but store {self.path} holds "
                              f"{self.info['arrays']}; all samples of a store share shapes and dtypes")
        key = sample_id.encode()
        writes = [(b"records", key, record), (b"index", key, _json_seal(entry))]
        new_info = None
        if not self.info["arrays"]:
            new_info = dict(self.info, arrays=arrays)
            writes.append((b"info", _INFO_KEY, _json_seal(new_info)))
        self._commit(writes)
        if new_info is not None:
            self.info = new_info
        self._index[sample_id] = entry
        self._dirty = True
        if time.monotonic() - self._last_manifest > self.cfg.manifest_every_s:
            self.write_manifest()
        return True

    def _stored_arrays(self, sample: Sample) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The arrays as stored and the factor each was multiplied by (float16 cbed only)."""
        cbed = np.ascontiguousarray(sample.cbed, dtype=np.float32)
        scale = 1.0
        if self.cfg.cbed_dtype == "float16":
            # intensities ~1/P^2 are float16 subnormals; scale them by a power of two (exact)
            scale = intensity_scale(cbed.shape[-1])
            try:
                cbed = _scaled_float16(cbed, np.float32(scale))
            except ValueError as exc:
                raise UserError(f"sample {sample.id}: {exc} after scaling by {scale:g}; float16 cannot store "
                                f"it: fix the simulation (patterns must carry total intensity 1) or set "
                                f"data.cbed_dtype=float32") from exc
        arrays = {"cbed": cbed,
                  "potential": np.ascontiguousarray(sample.potential, dtype=np.float32),
                  "density": np.ascontiguousarray(sample.density, dtype=np.float32)}
        return arrays, {"cbed": scale}

    def _commit(self, writes: list[tuple[bytes, bytes, bytes]]) -> None:
        """Write all ``(db, key, value)`` triples in one transaction, growing the map when it is full."""
        need = sum(len(value) for _, _, value in writes)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for db, key, value in writes:
                        txn.put(key, value, db=self._dbs[db])
                return
            except lmdb.MapFullError:
                self._grow(need)
            except lmdb.Error as exc:
                reason = self._write_failure_reason(exc, need)
                raise StoreFullError(f"could not write store {self.path}: {reason} ({exc}); every sample "
                                     f"committed before is intact: free space and resume") from exc

    def _write_failure_reason(self, exc: BaseException, need: int) -> str:
        """Name the likely cause of a failed commit (LMDB reports a short write as EIO)."""
        data_size = (self.path / DATA_NAME).stat().st_size
        free = shutil.disk_usage(self.path).free
        fsize_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if _is_disk_full(exc) or free < 2 * need:
            return f"disk full ({free >> 20} MiB free, a sample needs {need >> 20} MiB)"
        if fsize_limit != resource.RLIM_INFINITY and data_size + need > fsize_limit:
            return f"the file size limit (ulimit -f, {fsize_limit >> 20} MiB) is reached"
        return "I/O error (disk full, quota or failing device)"

    def _grow(self, need: int) -> None:
        current = self._env.info()["map_size"]
        cap = int(self.cfg.max_map_size_gb * (1 << 30))
        if current >= cap:
            raise StoreFullError(f"store {self.path} reached data.max_map_size_gb="
                                 f"{self.cfg.max_map_size_gb:g} GiB; raise it or start a new store "
                                 f"(every committed sample is intact)")
        self._env.set_mapsize(min(cap, max(2 * current, current + 4 * need)))

    # -- manifest / closing ----------------------------------------------------------------
    def write_manifest(self) -> dict[str, Any]:
        """Render manifest.json from the LMDB contents (atomic rename)."""
        manifest = build_manifest(self.path, self.info, self._index)
        try:
            _write_json_atomic(self.path / MANIFEST_NAME, manifest)
        except OSError as exc:
            if _is_disk_full(exc):
                raise StoreFullError(f"disk full writing {self.path / MANIFEST_NAME}; the LMDB records are "
                                     f"intact and the manifest is rebuilt on the next open") from exc
            raise
        self._last_manifest = time.monotonic()
        self._dirty = False
        return manifest

    def commit(self) -> None:
        """Flush LMDB to disk and refresh the manifest (records are already committed per put)."""
        self._require_open()
        self._env.sync(True)
        self.write_manifest()

    def _require_open(self) -> None:
        if self._env is None:
            raise StoreError(f"store writer for {self.path} is closed")

    def close(self) -> None:
        try:
            if self._env is not None:
                self._env.sync(True)
                if self._dirty:
                    self.write_manifest()
                _release_env(self.path, self._entry)
        finally:
            self._env = None
            if self._lock_fh is not None:
                self._lock_fh.truncate(0)  # readers: no writer any more (see writer_active)
                fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
                self._lock_fh.close()
                self._lock_fh = None

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# reader

#: mean record size from which readers keep kernel readahead on (see `StoreReader`).
READAHEAD_MIN_RECORD_BYTES = 1 << 20


def _lock_holder(text: str) -> tuple[int, str] | None:
    """(pid, host) that writer.lock records, or None when it is empty (no writer open). Stores
    written before the host was recorded hold a pid alone: this host's."""
    fields = text.split()
    if not fields or not fields[0].isdigit():
        return None
    return int(fields[0]), fields[1] if len(fields) > 1 else socket.gethostname()


def writer_active(path: Path) -> str | None:
    """``"pid N on HOST"`` when a `StoreWriter` may have the store at ``path`` open, else None.

    Read from writer.lock without locking it (taking even a shared flock would make a writer
    starting at that moment fail): a live pid on this host, or any pid recorded by another host
    (whose liveness cannot be checked from here), counts as open; a writer killed with -9 on
    this host leaves a dead pid, which does not."""
    try:
        holder = _lock_holder((path / LOCK_NAME).read_text())
    except OSError:
        return None
    if holder is None:
        return None
    pid, host = holder
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return f"pid {pid} on {host}"


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


def _load_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
    except PermissionError as exc:
        raise StoreError(f"permission denied reading {path / MANIFEST_NAME}; fix its permissions") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path / MANIFEST_NAME} is not valid JSON ({exc}); delete it and open the "
                          f"store with a writer to rebuild it") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise SchemaError(f"{path / MANIFEST_NAME} is not a {FORMAT_NAME} manifest; point at a store "
                          f"directory written by namsa")
    return manifest


def _copy_out(view: np.ndarray, dtype: Any, out: np.ndarray | None, scale: float) -> np.ndarray:
    """Copy ``view`` out of the LMDB map, cast to ``dtype``; ``scale != 1`` divides by the storage
    scale (a power of two, so exact) and yields float32 physical intensities."""
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
                    physical: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays ``names`` of sample ``i`` (copied out of the map, cast to ``dtype`` if given) + meta.

        ``physical``: undo the storage scale of float16 cbed (float32 intensities, total 1 per
        pattern); False returns the values as stored (see `stage.normalize.intensity_scale`).
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
        return arrays, rec.meta

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

    def meta(self, i: int) -> dict[str, Any]:
        """The meta dict of sample ``i`` (checksum verified) without copying its arrays out."""
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
        """The CBED intensity scale of these stores (`stage.normalize.intensity_scale` of P)."""
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


def open_stores(paths: str | os.PathLike | Sequence[str | os.PathLike], *, verify: bool = True,
                skip_corrupt: bool = False, readahead: bool | None = None) -> StoreSet:
    """Open several stores (or every store below data dirs) as one sequence; empty stores are skipped
    unless all are empty."""
    readers = [StoreReader(p, verify=verify, skip_corrupt=skip_corrupt, allow_empty=True, readahead=readahead)
               for p in expand_store_paths(paths)]
    if not any(len(r) for r in readers):
        raise EmptyStoreError(f"stores {[str(r.path) for r in readers]} hold no samples; run namsa simulate first")
    return StoreSet([r for r in readers if len(r)])
