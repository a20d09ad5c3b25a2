"""Reading a microscope 4D-STEM file lazily through rosettasciio: the file types and their readers.

Nothing is loaded when a file is opened: `RawScan.data` is a `LazyScan` whose slices are read from
the file on demand (rosettasciio's ``lazy=True`` -> dask over the file's own chunks or a memory
map), so a 10-100 GB scan is processed block by block (stage.microscope.tiles).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import calibrations_in
from .errors import ExperimentalInputError, MicroscopeFileError, parser_message
from .safety import check_file, check_values
from .zspy import read_zspy

#: file extension -> rosettasciio plugin module that reads it (Arina: a ``*_master.h5`` name, see `_module`)
READERS: dict[str, str] = {".hspy": "rsciio.hspy", ".hdf5": "rsciio.hspy", ".h5": "rsciio.hspy",
                           ".zspy": "rsciio.zspy", ".emd": "rsciio.emd", ".mib": "rsciio.quantumdetector",
                           ".xml": "rsciio.empad", ".raw": "rsciio.empad", ".dm4": "rsciio.digitalmicrograph",
                           ".dm3": "rsciio.digitalmicrograph", ".blo": "rsciio.blockfile",
                           ".ser": "rsciio.tia", ".emi": "rsciio.tia"}
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

    def __getitem__(self, key: Any) -> np.ndarray:
        part = self._array[key]
        if hasattr(part, "compute"):
            part = part.compute(scheduler="synchronous")  # one chunk at a time: bounded memory
        block = np.asarray(part)
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
    path = Path(path)
    if not (path.is_file() or (path.suffix.lower() == ".zspy" and path.is_dir())):  # zarr: a folder
        raise ExperimentalInputError(f"{path} does not exist or is not a file; pass a 4D-STEM file "
                                     f"({', '.join(sorted(READERS))})")
    if _module(path) == "rsciio.arina":  # read with h5py: rsciio's reader loads every frame
        return _read_arina(path)
    check_file(path)  # before rsciio opens it: nothing outside the file is followed
    signals = read_zspy(path) if _module(path) == "rsciio.zspy" else _rsciio_read(path)
    four_d = [s for s in signals if len(getattr(s.get("data"), "shape", ())) == 4]
    if not four_d:
        shapes = [tuple(getattr(s.get("data"), "shape", ())) for s in signals]
        raise ExperimentalInputError(f"{path} holds no 4-D dataset (found shapes {shapes}); namsa reconstruct needs "
                                     "(scan_y, scan_x, ky, kx) data")
    signal = four_d[0]
    return RawScan(data=LazyScan(signal["data"], str(path)), found=calibrations_in(signal), path=str(path))


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
    return RawScan(data=LazyScan(frames, str(path)), found=arina_calibrations(path), path=str(path))


def _module(path: Path) -> str:
    """The rsciio plugin for ``path``: by extension; a DECTRIS Arina master file by its name."""
    if path.name.lower().endswith("_master.h5"):
        return "rsciio.arina"
    module = READERS.get(path.suffix.lower())
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
