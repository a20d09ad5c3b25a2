"""Reading a microscope 4D-STEM file lazily through rosettasciio: the file types and their readers.

Nothing is loaded when a file is opened: `RawScan.data` is a `LazyScan` whose slices are read from
the file on demand (rosettasciio's ``lazy=True`` -> dask over the file's own chunks or a memory
map), so a 10-100 GB scan is processed block by block (stage.microscope.tiles).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import calibrations_in
from .errors import ExperimentalInputError, MicroscopeFileError, parser_message
from .links import check_links, companions
from .safety import check_file, check_values
from .zspy import hspy_is_contiguous, read_hspy_h5, read_zspy

#: file extension -> rosettasciio plugin module that reads it (Arina: a ``*_master.h5`` name, see `_module`)
READERS: dict[str, str] = {".hspy": "rsciio.hspy", ".hdf5": "rsciio.hspy", ".h5": "rsciio.hspy",
                           ".zspy": "rsciio.zspy", ".emd": "rsciio.emd", ".mib": "rsciio.quantumdetector",
                           ".xml": "rsciio.empad", ".dm4": "rsciio.digitalmicrograph",
                           ".dm3": "rsciio.digitalmicrograph", ".blo": "rsciio.blockfile",
                           ".ser": "rsciio.tia", ".emi": "rsciio.tia"}
#: declared bytes of data per byte stored above which a file is refused (`check_declared_size`):
#: deflate (HyperSpy's gzip) stops near 1,000:1, and no detector's counts compress 10,000:1
MAX_DECLARED_PER_STORED = 10_000
#: readers without a lazy mode (Digital Micrograph files are read whole; they are small)
_EAGER = frozenset({"rsciio.digitalmicrograph"})


class LazyScan:
    """A (scan_y, scan_x, ky, kx) dataset left in its file: ``shape``, ``dtype``, ``ndim``, and
    numpy-style slicing that reads only the selected part and returns a numpy array whose values
    were checked (real-valued, finite: stage.microscope.safety.check_values)."""

    def __init__(self, array: Any, path: str) -> None:
        self._array = array
        self.path = path
        self.shape: tuple[int, ...] = tuple(int(n) for n in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)
        check_values(np.empty(0, dtype=self.dtype), path)  # the dtype is refused before any read
        if self.ndim != 4 or 0 in self.shape:
            raise MicroscopeFileError(f"{path}: its 4-D dataset has shape {self.shape}: no scan position or no "
                                      "detector pixel; namsa reconstruct needs (scan_y, scan_x, ky, kx) data with "
                                      "at least one of each")

    def __getitem__(self, key: Any) -> np.ndarray:
        try:
            part = self._array[key]
            if hasattr(part, "compute"):
                part = part.compute(scheduler="synchronous")  # one chunk at a time: bounded memory
            block = np.asarray(part)
        except (MicroscopeFileError, MemoryError):
            raise
        except Exception as exc:  # lazy: a damaged chunk, a short file, fails only when its bytes are read
            raise MicroscopeFileError(f"{self.path}: its data could not be read ({parser_message(exc)}); the file "
                                      "is damaged or incomplete: copy it again (or re-export it)") from None
        if block.ndim == 4:
            check_values(block, self.path, _origin(key))
        else:
            check_values(block, self.path)
        return block

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole dataset (never loaded at once)."""
        return int(np.prod(self.shape)) * self.dtype.itemsize


def _origin(key: Any) -> tuple[int, int]:
    """Scan position (y, x) where a block ``data[key]`` starts, for plain forward slices (else 0)."""
    key = key if isinstance(key, tuple) else (key,)
    starts = [k.start or 0 if isinstance(k, slice) and (k.step or 1) > 0 else 0 for k in key[:2]]
    return (starts + [0, 0])[0], (starts + [0, 0])[1]


@dataclass
class RawScan:
    """A 4-D dataset as read: ``data`` (scan_y, scan_x, ky, kx), lazy (`LazyScan`) or an array,
    and the calibrations found in the file.

    ``found`` maps a calibration name (energy_kv, semiangle_mrad, dk_inv_A, dk_mrad, step_A) to
    its value in those units; dk_* and step_A are (y, x) pairs; step_A keeps its sign (a negative
    step is an axis scanned against the calibrated direction).
    """

    data: Any
    found: dict[str, Any]
    path: str


def read_scan(path: str | Path) -> RawScan:
    """Open a 4-D STEM file through rosettasciio without loading it; the first 4-D dataset is used."""
    try:
        return _open_scan(Path(path))
    except OSError as exc:  # the system refused to read the input (permission, I/O error): about it, not --out
        raise MicroscopeFileError(f"{path} could not be read ({exc.strerror or exc}); check the file is readable "
                                  "and complete") from None


def _open_scan(path: Path) -> RawScan:
    check_links(path)  # before anything is opened: no link leads the reader out of the folder
    if not (path.is_file() or (path.suffix.lower() == ".zspy" and path.is_dir())):  # zarr: a folder
        raise ExperimentalInputError(f"{path} does not exist or is not a file; pass a 4D-STEM file "
                                     f"({', '.join(sorted(READERS))})")
    if _module(path) == "rsciio.arina":  # read with h5py: rsciio's reader loads every frame
        return _read_arina(path)
    check_file(path)  # before rsciio opens it: nothing outside the file is followed
    signals = _signals(path)
    four_d = [s for s in signals if len(getattr(s.get("data"), "shape", ())) == 4]
    if not four_d:
        shapes = [tuple(getattr(s.get("data"), "shape", ())) for s in signals]
        raise ExperimentalInputError(f"{path} holds no 4-D dataset (found shapes {shapes}); namsa reconstruct needs "
                                     "(scan_y, scan_x, ky, kx) data")
    data = LazyScan(four_d[0]["data"], str(path))
    check_declared_size(path, data, [path, *companions(path)])
    return RawScan(data=data, found=calibrations_in(four_d[0]), path=str(path))


def check_declared_size(path: Path, data: LazyScan, files: list[Path]) -> None:
    """Refuse a dataset whose declared size is absurd for the bytes ``files`` really hold: HDF5 or
    zarr chunks never written read back as fill values, so a few kB can declare terabytes, and
    every check would then read them all. An EMPAD header's raw file is checked to the byte (safety)."""
    if path.suffix.lower() == ".xml":
        return
    stored = sum(_stored_bytes(f) for f in files)
    if data.nbytes > MAX_DECLARED_PER_STORED * max(stored, 1):
        raise MicroscopeFileError(f"{path} declares a {' x '.join(map(str, data.shape))} {data.dtype} dataset "
                                  f"({data.nbytes / 2**30:.3g} GiB) but holds only {stored} bytes, more than "
                                  f"{MAX_DECLARED_PER_STORED}:1 compression; its data were never written (or the "
                                  "shape is wrong): copy the file again or re-export it")


def _stored_bytes(path: Path) -> int:
    """Bytes in a file, or in every file under a folder (a .zspy)."""
    if not path.is_dir():
        return os.path.getsize(path) if path.is_file() else 0
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, names in os.walk(path) for f in names)


def _read_arina(path: Path) -> RawScan:
    from .arina import ArinaFrames, arina_calibrations, check_arina

    check_arina(path)
    try:
        frames = ArinaFrames(path)
    except MicroscopeFileError:
        raise
    except Exception as exc:  # a damaged or foreign file fails inside h5py in many ways
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as an Arina master file ({text}); check the file "
                                     "and its data files are complete") from None
    data = LazyScan(frames, str(path))
    check_declared_size(path, data, [path, *frames.files])
    return RawScan(data=data, found=arina_calibrations(path), path=str(path))


def _signals(path: Path) -> list[dict[str, Any]]:
    """rsciio-style signal dicts; .zspy and contiguous .hspy through namsa's own lazy readers."""
    if _module(path) == "rsciio.zspy":
        return read_zspy(path)
    if _module(path) == "rsciio.hspy" and hspy_is_contiguous(path):
        return read_hspy_h5(path)
    return _rsciio_read(path)


def _module(path: Path) -> str:
    """The rsciio plugin for ``path``: by extension; a DECTRIS Arina master file by its name."""
    if path.name.lower().endswith("_master.h5"):
        return "rsciio.arina"
    module = READERS.get(path.suffix.lower())
    if path.suffix.lower() == ".raw":
        raise ExperimentalInputError(f"{path}: an EMPAD .raw file is read through its XML header, which names it "
                                     "and gives the scan size: pass the .xml beside it")
    if module is None:
        raise ExperimentalInputError(f"{path}: unknown file type {path.suffix!r}; namsa reconstruct reads "
                                     f"{', '.join(sorted(READERS))} and Arina *_master.h5 (convert other formats "
                                     "to .hspy)")
    return module


def _rsciio_read(path: Path) -> list[dict[str, Any]]:
    import importlib

    module = _module(path)
    try:
        reader = importlib.import_module(module).file_reader
    except ImportError:
        raise ExperimentalInputError("reading experimental files needs rosettasciio: pip install -e '.[io]'") from None
    try:
        return list(reader(str(path), lazy=module not in _EAGER))
    except Exception as exc:  # any parser failure of a foreign file is bad input
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as {module.split('.')[-1]} ({text}); check the "
                                     "file is complete and of that format") from None
