"""DECTRIS Arina files (``*_master.h5``), read lazily with h5py.

rsciio 0.15's Arina reader reads every frame into memory whatever ``lazy`` says, so namsa reads the
layout itself: ``/entry/data/data_NNNNNN`` in the master file are external links to data files
beside it, each an (n, ky, kx) stack of frames in scan order; the scan is square (as rsciio assumes)
and ``/STEM Metadata`` gives the scan pixel size in nm. Only links to plain file names in the
master's own folder are followed (by namsa, not by HDF5's search path), they must be regular files,
not symbolic links, and the master and the data files must otherwise be self-contained (no
virtual datasets, external raw storage or other external links: stage.microscope.safety). The
data files are the only files it opens beyond the master, and they count in its stored size.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExperimentalInputError, MicroscopeFileError, parser_message
from ..safety import check_hdf5_self_contained, refuse_companion_link
from ..scan import LazyScan, RawScan, check_declared_size
from .base import FileFormat, ScanCalibrations

#: frames per data file of `write_arina` (DECTRIS writes a fixed number per file; 100 by default)
FRAMES_PER_FILE = 100


def check_arina(master: Path) -> None:
    """The master holds no virtual dataset, external raw storage or external link anywhere, except
    the external links directly under ``/entry/data``; each of those names a regular file beside
    the master (no folder part, not a symbolic link) that exists and holds its data itself. Nothing
    outside the master is opened before all of this has passed."""
    for link in check_hdf5_self_contained(master, links_in="/entry/data"):
        _check_data_file(master, link.filename)


def _check_data_file(master: Path, name: str) -> None:
    target = master.parent / name
    if Path(name).name != name or name in (".", ".."):
        raise MicroscopeFileError(f"{master}: its frames link to {name!r}, not a file beside the master; namsa "
                                  "reads only data files in the master's folder: copy them there")
    refuse_companion_link(target, master)
    if not target.is_file():
        raise MicroscopeFileError(f"{master}: its data file {target} does not exist; copy it beside the master")
    check_hdf5_self_contained(target)


class ArinaFrames:
    """The frames of an Arina master file as a (scan_y, scan_x, ky, kx) array-like: ``shape``,
    ``dtype`` and slicing over the scan axes that reads only the frames asked for."""

    def __init__(self, master: Path) -> None:
        import h5py

        self._file = h5py.File(master, "r")
        group = self._file.get("entry/data", getlink=True)
        group = self._file["entry/data"] if isinstance(group, h5py.HardLink) else None
        if not isinstance(group, h5py.Group) or not len(group):
            raise MicroscopeFileError(f"{master}: no /entry/data frames; this is not an Arina master file")
        self._data_files: list[h5py.File] = []  # kept open: the frames are read from them lazily
        self._sets = [self._frames_of(master, group, name) for name in sorted(group)]
        self.files = [Path(f.filename) for f in self._data_files]
        counts = [int(d.shape[0]) for d in self._sets]
        self._ends = np.cumsum(counts)
        side = math.isqrt(int(self._ends[-1]))
        if side * side != self._ends[-1]:
            raise MicroscopeFileError(f"{master} holds {int(self._ends[-1])} frames, not a square scan; save it as "
                                      ".hspy with its scan shape (hyperspy: load(..., navigation_shape=(y, x)))")
        self.shape = (side, side, *self._sets[0].shape[1:])
        self.dtype = self._sets[0].dtype

    def _frames_of(self, master: Path, group: Any, name: str) -> Any:
        """The dataset ``/entry/data/<name>``: an external link is opened here, in the master's own
        folder as `check_arina` checked it (not by HDF5's search path, which also tries the working
        directory and $HDF5_EXT_PREFIX); a soft link is refused (DECTRIS writes none)."""
        import h5py

        link = group.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            self._data_files.append(h5py.File(master.parent / link.filename, "r"))
            return self._data_files[-1][link.path]
        if not isinstance(link, h5py.HardLink):
            raise MicroscopeFileError(f"{master}: /entry/data/{name} is a soft link; an Arina master links its "
                                      "frames to data files beside it: save the scan again")
        return group[name]

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
    """The scan step (Angstrom) from ``/STEM Metadata``'s ``Pixel Size`` (nm), when it is a positive
    finite number in a group of the master itself (a link there is not followed)."""
    import h5py

    with h5py.File(master, "r") as f:
        link = f.get("STEM Metadata", getlink=True)
        meta = f["STEM Metadata"] if isinstance(link, h5py.HardLink) else None
        size = meta.attrs.get("Pixel Size") if isinstance(meta, h5py.Group) else None
    try:
        nm = float(np.ravel(np.asarray(size, dtype=np.float64))[0])
    except (TypeError, ValueError, IndexError):  # absent, text, empty: no calibration in the file
        return {}
    if not math.isfinite(nm) or nm <= 0:
        return {}
    return {"step_A": (nm * 10.0, nm * 10.0)}


def read_arina(path: Path) -> RawScan:
    """The frames of an Arina master file, left in its data files, and the scan step it records
    (after `check_arina`)."""
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


def write_arina(master: Path, data: Any, cal: ScanCalibrations) -> Path:
    """A DECTRIS Arina master file as its software writes one: ``/entry/data/data_NNNNNN`` external
    links to ``<stem>_data_NNNNNN.h5`` beside it, each ``/entry/data/data`` an (n, ky, kx) stack of
    `FRAMES_PER_FILE` frames in scan order, and ``/STEM Metadata``'s ``Pixel Size`` (nm) when the
    scan step is known. The scan must be square with one step (what the reader assumes)."""
    import h5py

    sy, sx, ky, kx = data.shape
    if sy != sx or (cal.step_A is not None and not math.isclose(abs(cal.step_A[0]), abs(cal.step_A[1]))):
        raise ExperimentalInputError(f"an Arina file holds a square scan of one step; this one is {sy} x {sx} at "
                                     f"{cal.step_A} Angstrom: write it as .hspy")
    frames = np.asarray(data).reshape(sy * sx, ky, kx)
    stem = master.name[: -len("_master.h5")]
    with h5py.File(master, "w") as f:
        if cal.step_A is not None:
            f.create_group("STEM Metadata").attrs["Pixel Size"] = np.array([abs(cal.step_A[0]) / 10.0])
        group = f.create_group("entry/data")
        for i, start in enumerate(range(0, len(frames), FRAMES_PER_FILE)):
            name = f"{stem}_data_{i + 1:06d}.h5"
            with h5py.File(master.parent / name, "w") as d:
                d.create_dataset("entry/data/data", data=frames[start: start + FRAMES_PER_FILE])
            group[f"data_{i + 1:06d}"] = h5py.ExternalLink(name, "/entry/data/data")
    return master


FORMAT = FileFormat(name="Arina", module=__name__, name_ends="_master.h5", read=read_arina, check=check_arina,
                    write=write_arina, records=("step_A",))
