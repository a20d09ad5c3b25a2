"""`StoreWriter`: the exactly-once, crash-safe writer of one store."""
from __future__ import annotations

import fcntl
import os
import resource
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from namsa.errors import UserError
from namsa.sample import Sample

from . import codec, dir_swap
from .config import DataConfig
from .errors import NotAStoreError, SchemaError, StoreError, StoreFullError, StoreLockedError
from .layout import DATA_NAME, LOCK_NAME, MANIFEST_NAME, is_store
from .lmdbenv import _acquire_env, _creation_error, _is_disk_full, _release_env
from .jsonfile import TMP_PREFIX, write_json_atomic
from .manifest import (_INFO_KEY, SCHEMA_VERSION, _check_schema_version, _json_seal, _load_manifest,
                       _read_info_and_index, build_manifest, code_version)
from .splits import sample_split
from .stats import sample_statistics
from .transforms import intensity_scale
from .writerlock import _lock_holder


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


def _same_file(fh: Any, path: Path) -> bool:
    """Whether the open file ``fh`` is still the file at ``path`` (not unlinked or replaced)."""
    try:
        return os.path.samestat(os.fstat(fh.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


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
            self._remove_killed_manifests()
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
        if not _same_file(fh, self.path / LOCK_NAME):  # locked a lock file a writer removing its empty store unlinked
            fh.close()
            raise StoreLockedError(f"store {self.path} is being removed by its writer (it stored nothing); "
                                   f"write into another store directory")
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()} {socket.gethostname()}")
            fh.flush()
        except OSError as exc:  # readers must see that a writer is open: no lock without its holder
            fh.close()
            raise _creation_error(self.path, lmdb.Error(f"{self.path / LOCK_NAME}: {exc.strerror}")) from exc
        self._lock_fh = fh

    def _remove_killed_manifests(self) -> None:
        """Delete temporary manifests a writer killed mid-write left (only the lock holder writes them)."""
        for tmp in self.path.glob(f"{TMP_PREFIX}{MANIFEST_NAME}.*"):
            tmp.unlink(missing_ok=True)

    def _open_env(self) -> None:
        data_file = self.path / DATA_NAME
        size = data_file.stat().st_size if data_file.exists() else 0
        self._entry = _acquire_env(self.path, write=True, map_size=max(self.cfg.map_size_mb << 20, size))
        self._env = self._entry.env
        self._dbs = self._entry.dbs

    def _load_or_create_info(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        info, index = _read_info_and_index(self._env, self._dbs, self.path)
        if info:
            _check_schema_version(self.path, info.get("schema_version"), "LMDB info")
            differs = self._differing_setting(info)
            if differs is None:
                return info, index
            if index:
                raise SchemaError(f"store {self.path} was written with {differs}; resume with the same "
                                  f"configuration or use a new directory")
        # A new store, or one whose writer was killed before its info record or its first sample:
        # holding no sample, it cannot disagree with this writer, which adopts it.
        info = {"schema_version": SCHEMA_VERSION, "config_hash": self.config_hash,
                "cbed_dtype": self.cfg.cbed_dtype, "compression": self.cfg.compression,
                "split_fractions": list(self.cfg.split_fractions), "split_seed": self.cfg.split_seed,
                "split_by": self.cfg.split_by, "code_version": code_version(), "arrays": {},
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._commit([(b"info", _INFO_KEY, _json_seal(info))])
        return info, index

    def _differing_setting(self, info: dict[str, Any]) -> str | None:
        """``key=stored, not wanted`` for the first setting ``info`` holds that this writer's differs
        from; None when they agree."""
        for key, wanted in (("config_hash", self.config_hash), ("cbed_dtype", self.cfg.cbed_dtype),
                            ("split_fractions", list(self.cfg.split_fractions)),
                            ("split_seed", self.cfg.split_seed), ("split_by", self.cfg.split_by)):
            # stores written before split_by existed split by material
            if info.get(key, "material" if key == "split_by" else None) != wanted:
                return f"{key}={info.get(key)!r}, not {wanted!r}"
        return None

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
        if sample.meta.config_hash != self.config_hash:
            raise UserError(f"sample {sid} has config_hash {sample.meta.config_hash!r} but store "
                            f"{self.path} holds config {self.config_hash!r}; write it to its own store")
        arrays, scales = self._stored_arrays(sample)
        shapes = {name: {"dtype": a.dtype.str, "shape": list(a.shape), "scale": scales.get(name, 1.0)}
                  for name, a in arrays.items()}
        if self.info["arrays"] and self.info["arrays"] != shapes:
            # checked before the (costly) encoding; put_record checks again for raw records
            raise SchemaError(f"sample {sid} has arrays {shapes} but store {self.path} holds "
                              f"{self.info['arrays']}; all samples of a store share shapes and dtypes")
        codecs = {"cbed": "zstd-shuffle"} if self.cfg.compression == "zstd" else {}
        record = codec.encode_record(arrays, sample.meta.to_json(), codecs, self.cfg.compression_level, scales)
        split = sample_split(sample.meta, self.cfg.split_fractions, self.cfg.split_seed, self.cfg.split_by)
        stats_scale = intensity_scale(arrays["cbed"].shape[-1]) / scales["cbed"]
        entry = {"split": split, "material_id": str(sample.meta.material_id), "nbytes": len(record),
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
            write_json_atomic(self.path / MANIFEST_NAME, manifest, sort_keys=True)
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

    def close_removing_if_empty(self) -> bool:
        """Close the store; when it holds no sample (and no reader in this process has it open), delete it
        first (True), so that a writer whose whole share was stored by other writers, or failed, leaves
        no EMPTY store behind for ``namsa inspect --verify`` to flag. The lock is held until the files are gone, and data.mdb
        goes after the other files: another writer trying this directory meanwhile finds it locked
        or still a store (never a stray file), and a reader never finds half a store."""
        if self._env is None or self._index or self._entry.refs > 1:
            # refs > 1: a reader in this process still holds the environment; deleting its files under
            # it would leave a cached handle on unlinked files for the next writer of this path
            self.close()
            return False
        _release_env(self.path, self._entry)   # no sync: its files are deleted next
        self._env = None
        keep = (DATA_NAME, "lock.mdb", LOCK_NAME)
        for item in self.path.iterdir():
            if item.name not in keep:
                dir_swap.remove(item)
        for name in keep:
            (self.path / name).unlink(missing_ok=True)
        self._lock_fh.close()  # unlinked above while locked: a writer that opened it now sees it gone
        self._lock_fh = None
        try:
            self.path.rmdir()
        except OSError:  # another writer has made the directory its store meanwhile: it is theirs
            pass
        return True

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
