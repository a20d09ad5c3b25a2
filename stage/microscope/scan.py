"""A 4-D scan as read from a microscope file: `RawScan` (the data and the calibrations found) and
`LazyScan` (the data left in the file, read slice by slice).

Nothing is loaded when a file is opened: `RawScan.data` is a `LazyScan` whose slices are read from
the file on demand (rosettasciio's ``lazy=True`` -> dask over the file's own chunks or a memory
map), so a 10-100 GB scan is processed block by block (models.scan_fit.tiles).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import MicroscopeFileError, parser_message
from .safety import check_values

#: declared bytes of data per byte stored above which a file is refused (`check_declared_size`):
#: deflate (HyperSpy's gzip) stops near 1,000:1, and no detector's counts compress 10,000:1
MAX_DECLARED_PER_STORED = 10_000


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


def check_declared_size(path: Path, data: LazyScan, files: list[Path]) -> None:
    """Refuse a dataset whose declared size is absurd for the bytes ``files`` really hold: HDF5 or
    zarr chunks never written read back as fill values, so a few kB can declare terabytes, and
    every check would then read them all."""
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
