"""DECTRIS Arina files (``*_master.h5``), read lazily with h5py.

rsciio 0.15's Arina reader reads every frame into memory whatever ``lazy`` says, so namsa reads the
layout itself: ``/entry/data/data_NNNNNN`` in the master file are external links to data files
beside it, each an (n, ky, kx) stack of frames in scan order; the scan is square (as rsciio assumes)
and ``/STEM Metadata`` gives the scan pixel size in nm. Only links to plain file names in the
master's own folder are followed, and the data files must themselves be self-contained.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .errors import MicroscopeFileError
from .safety import check_hdf5_self_contained


def check_arina(master: Path) -> None:
    """Every link under ``/entry/data`` names a file beside the master (no folder part, no symlink
    leaving the folder) that exists and holds its data itself."""
    import h5py

    with h5py.File(master, "r") as f:
        group = f.get("entry/data")
        if not isinstance(group, h5py.Group) or not len(group):
            raise MicroscopeFileError(f"{master}: no /entry/data frames; this is not an Arina master file")
        for name in group:
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                _check_data_file(master, link.filename)


def _check_data_file(master: Path, name: str) -> None:
    target = master.parent / name
    if Path(name).name != name or target.resolve().parent != master.parent.resolve():
        raise MicroscopeFileError(f"{master}: its frames link to {name!r}, not a file beside the master; namsa "
                                  "reads only data files in the master's folder: copy them there")
    if not target.is_file():
        raise MicroscopeFileError(f"{master}: its data file {target} does not exist; copy it beside the master")
    check_hdf5_self_contained(target)


class ArinaFrames:
    """The frames of an Arina master file as a (scan_y, scan_x, ky, kx) array-like: ``shape``,
    ``dtype`` and slicing over the scan axes that reads only the frames asked for."""

    def __init__(self, master: Path) -> None:
        import h5py

        self._file = h5py.File(master, "r")
        group = self._file["entry/data"]
        self._sets = [group[name] for name in sorted(group)]
        counts = [int(d.shape[0]) for d in self._sets]
        self._ends = np.cumsum(counts)
        side = math.isqrt(int(self._ends[-1]))
        if side * side != self._ends[-1]:
            raise MicroscopeFileError(f"{master} holds {int(self._ends[-1])} frames, not a square scan; save it as "
                                      ".hspy with its scan shape (hyperspy: load(..., navigation_shape=(y, x)))")
        self.shape = (side, side, *self._sets[0].shape[1:])
        self.dtype = self._sets[0].dtype

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        ys, xs = (np.arange(self.shape[a])[k] for a, k in zip((0, 1), (*key, slice(None), slice(None))[:2]))
        cols = np.atleast_1d(xs)
        if cols.size > 1 and np.any(np.diff(cols) < 0):
            raise IndexError("Arina frames are read with increasing scan indices only")
        rows = [self._frames(y * self.shape[1] + cols) for y in np.atleast_1d(ys)]  # one scan row at a time
        block = np.stack(rows) if rows else np.empty((0, cols.size, *self.shape[2:]), self.dtype)
        block = block[(0 if np.ndim(ys) == 0 else slice(None), 0 if np.ndim(xs) == 0 else slice(None))]
        return block[(Ellipsis, *key[2:])] if len(key) > 2 else block

    def _frames(self, flat: np.ndarray) -> np.ndarray:
        """Frames at increasing flat scan indices of one scan row, read dataset by dataset (each a
        contiguous read of at most the row's span)."""
        which = np.searchsorted(self._ends, flat, side="right")
        parts = []
        for d in np.unique(which):
            local = flat[which == d] - (self._ends[d - 1] if d else 0)
            parts.append(self._sets[d][local[0]: local[-1] + 1][local - local[0]])
        return np.concatenate(parts)


def arina_calibrations(master: Path) -> dict[str, Any]:
    """The scan step (Angstrom) from ``/STEM Metadata``'s ``Pixel Size`` (nm), when present."""
    import h5py

    with h5py.File(master, "r") as f:
        meta = f.get("STEM Metadata")
        size = meta.attrs.get("Pixel Size") if meta is not None else None
    if size is None or not np.isfinite(np.ravel(size)[0]) or np.ravel(size)[0] == 0:
        return {}
    step = float(np.ravel(size)[0]) * 10.0
    return {"step_A": (step, step)}
