"""Reading a microscope 4D-STEM file lazily: the format the registry names opens it.

Nothing is loaded when a file is opened: `RawScan.data` is a `LazyScan` (stage.microscope.scan)
whose slices are read from the file on demand. Which formats are read, and how, is
stage.microscope.formats (one module per format); this module only runs the steps every format
shares: the link checks, the format's own checks, its reader, then the first 4-D dataset.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import formats
from .calibration import calibrations_in
from .errors import ExperimentalInputError, MicroscopeFileError
from .links import check_links, companions
from .scan import LazyScan, RawScan, check_declared_size


def read_scan(path: str | Path) -> RawScan:
    """Open a 4-D STEM file without loading it; the first 4-D dataset is used."""
    try:
        return _open_scan(Path(path))
    except OSError as exc:  # the system refused to read the input (permission, I/O error): about it, not --out
        raise MicroscopeFileError(f"{path} could not be read ({exc.strerror or exc}); check the file is readable "
                                  "and complete") from None


def _open_scan(path: Path) -> RawScan:
    check_links(path)  # before anything is opened: no link leads the reader out of the folder
    found = formats.format_of(path)
    if not (path.is_file() or (found is not None and found.folder and path.is_dir())):  # zarr: a folder
        raise ExperimentalInputError(f"{path} does not exist or is not a file; pass a 4D-STEM file "
                                     f"({', '.join(formats.suffixes())})")
    fmt = formats.claim(path)
    fmt.check(path)  # before the reader opens it: nothing outside the file is followed
    opened = fmt.open(path)
    if isinstance(opened, RawScan):  # the format's own reader did the rest (Arina)
        return opened
    return _first_4d(path, opened, fmt.declared_size)


def _first_4d(path: Path, signals: list[dict[str, Any]], declared_size: bool) -> RawScan:
    """The first 4-D signal, left in the file, with the calibrations its metadata holds."""
    four_d = [s for s in signals if len(getattr(s.get("data"), "shape", ())) == 4]
    if not four_d:
        shapes = [tuple(getattr(s.get("data"), "shape", ())) for s in signals]
        raise ExperimentalInputError(f"{path} holds no 4-D dataset (found shapes {shapes}); namsa reconstruct needs "
                                     "(scan_y, scan_x, ky, kx) data")
    data = LazyScan(four_d[0]["data"], str(path))
    if declared_size:
        check_declared_size(path, data, [path, *companions(path)])
    return RawScan(data=data, found=calibrations_in(four_d[0]), path=str(path))
