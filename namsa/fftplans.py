"""FFTW plans that are fast *and* the same in every process: wisdom measured once per machine.

FFTW_PATIENT plans run 8-16x faster than FFTW_ESTIMATE plans at 256^2-512^2 on the build
machine (benchmarks/RESULTS.md, "FFT plans and probe-by-probe speed"), but they pick their algorithm by timing
candidates, so two processes that plan independently may pick different algorithms and produce
patterns that differ in their last bits. Here the first process that needs a transform shape
measures it, under a file lock, and saves FFTW's wisdom to a per-machine file in the cache
directory; every process imports that file before planning, so every process on the machine (and
on every machine that shares the cache directory and has the same CPU and FFTW) builds exactly the
same plan, and a sample is bit-identical wherever it is simulated.

Cache directory: ``$NAMSA_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/namsa``, else
``~/.cache/namsa``. The wisdom file is named after a hash of the CPU model and flags, the FFTW
and pyFFTW versions and the SIMD alignment (:func:`machine_key`); deleting it only costs a
re-measurement (about 1-12 s per shape with FFTW_PATIENT here).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator

#: planner efforts offered, fastest to plan first; "estimate" never times anything (no wisdom needed)
EFFORTS = {"estimate": "FFTW_ESTIMATE", "measure": "FFTW_MEASURE", "patient": "FFTW_PATIENT"}
WISDOM_FORMAT = 1

_LOCK = threading.Lock()        # FFTW's planner is not thread-safe; also guards _imported
_imported: set[Path] = set()    # wisdom files this process has imported and is current with


def cache_dir() -> Path:
    """Directory of namsa's per-machine caches (``$NAMSA_CACHE_DIR`` > ``$XDG_CACHE_HOME/namsa``)."""
    if os.environ.get("NAMSA_CACHE_DIR"):
        return Path(os.environ["NAMSA_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "namsa"


def _cpu_identity() -> str:
    """CPU model name and feature flags (Linux), else the platform's processor string."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', '')}|{fields.get('flags', '')}"


def machine_key() -> str:
    """Hash of what decides which FFTW plan is valid and fastest: CPU, FFTW, pyFFTW, alignment."""
    import pyfftw

    fftw_version = pyfftw.export_wisdom()[1].split(b" ", 1)[0].decode()   # e.g. "(fftw-3.3.5"
    text = "|".join([_cpu_identity(), fftw_version, pyfftw.__version__, str(pyfftw.simd_alignment),
                     str(WISDOM_FORMAT)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wisdom_path() -> Path:
    """This machine's wisdom file in :func:`cache_dir`."""
    return cache_dir() / f"fftw-wisdom-{machine_key()}.json"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock across processes (flock on ``path``.lock), so one process measures a shape."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _import_file(path: Path) -> dict:
    """Import the wisdom stored in ``path`` (if any) into this process; returns the file's record."""
    import pyfftw

    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"shapes": []}
    pyfftw.import_wisdom(tuple(w.encode() for w in record["wisdom"]))
    return record


def _save(path: Path, record: dict, shape: list) -> None:
    """Write this process's whole wisdom (the file's, imported first, plus the new shape) atomically."""
    import pyfftw

    shapes = sorted({tuple(s) for s in record.get("shapes", [])} | {tuple(shape)})
    out = {"format": WISDOM_FORMAT, "machine": _cpu_identity().split("|")[0], "shapes": [list(s) for s in shapes],
           "wisdom": [w.decode() for w in pyfftw.export_wisdom()]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(out, fh)
    os.replace(tmp, path)


def _plans(buffer: Any, flags: tuple[str, ...]) -> tuple[Any, Any]:
    import pyfftw

    kw = dict(axes=(-2, -1), flags=flags, threads=1)
    return (pyfftw.FFTW(buffer, buffer, direction="FFTW_FORWARD", **kw),
            pyfftw.FFTW(buffer, buffer, direction="FFTW_BACKWARD", **kw))


def plan_pair(buffer: Any, effort: str = "patient") -> tuple[Any, Any, bool]:
    """In-place unnormalised forward and backward 2-D FFTW plans over the last two axes of ``buffer``
    (a pyfftw-aligned complex array), and whether this call had to measure (False: from wisdom).

    The contents of ``buffer`` are destroyed while planning. For "measure" / "patient" the plans come
    from this machine's wisdom file; a shape not in it is measured once under a file lock and added.
    """
    if effort not in EFFORTS:
        raise ValueError(f"FFT planner effort must be one of {sorted(EFFORTS)}, got {effort!r}")
    flags = (EFFORTS[effort], "FFTW_DESTROY_INPUT")
    with _LOCK:
        if effort == "estimate":
            return (*_plans(buffer, flags), False)
        path = wisdom_path()
        if path not in _imported:
            _import_file(path)
            _imported.add(path)
        with contextlib.suppress(RuntimeError):          # "No FFTW wisdom is known for this plan."
            return (*_plans(buffer, flags + ("FFTW_WISDOM_ONLY",)), False)
        try:
            with _file_lock(path):
                record = _import_file(path)              # another process may have just measured it
                with contextlib.suppress(RuntimeError):
                    return (*_plans(buffer, flags + ("FFTW_WISDOM_ONLY",)), False)
                plans = _plans(buffer, flags)
                _save(path, record, [str(buffer.dtype), *buffer.shape])
                return (*plans, True)
        except OSError as exc:
            warnings.warn(f"namsa: cannot share FFTW wisdom in {path.parent} ({exc.strerror}); plans measured "
                          "in this process only, so samples may differ in their last bits between processes. "
                          "Set NAMSA_CACHE_DIR to a writable directory.", RuntimeWarning, stacklevel=2)
            return (*_plans(buffer, flags), True)
