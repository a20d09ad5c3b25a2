"""Writing a 4D-STEM scan in the formats `namsa reconstruct` reads (microscope-like test data).

`write_scan(path, data, calibrations)` writes ``data`` (scan_y, scan_x, ky, kx) as the format that
claims ``path`` (stage.microscope.formats: the same registry the reader asks) and returns the
calibrations that file keeps: HyperSpy .hspy/.hdf5/.h5 and EMD through rosettasciio's own writers,
.zspy in HyperSpy's zarr-2 layout, EMPAD (.xml + .raw) and Merlin (.mib + .hdr) byte by byte from
their published layouts, Arina (*_master.h5 + data files) as DECTRIS writes it. What a format has no
room for (an EMPAD file's beam energy, any calibration of a .mib) is given to `namsa reconstruct`
as flags. Formats namsa only reads (Digital Micrograph, TIA, blockfile) have no writer.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from .errors import ExperimentalInputError
from .formats import FORMATS, format_of
from .formats.base import ScanCalibrations


def write_scan(path: str | Path, data: Any, calibrations: ScanCalibrations) -> dict[str, Any]:
    """Write ``data`` (scan_y, scan_x, ky, kx) to ``path`` in the format its name asks for; returns
    {calibration name: value} of those the file keeps (the rest must be given as flags)."""
    path = Path(path)
    fmt = format_of(path)
    if fmt is None or fmt.write is None:
        raise ExperimentalInputError(f"{path}: namsa writes no {fmt.name if fmt else repr(path.suffix)} files; it "
                                     f"writes {', '.join(writable())}")
    if getattr(data, "ndim", 0) != 4:
        raise ExperimentalInputError(f"{path}: a scan to write must be (scan_y, scan_x, ky, kx), got shape "
                                     f"{getattr(data, 'shape', None)}")
    fmt.write(path, data, calibrations)
    return {k: v for k, v in asdict(calibrations).items() if k in fmt.records and v is not None}


def writable() -> list[str]:
    """The formats `write_scan` writes: each one's name and what it claims (suffixes or name rule)."""
    return [f"{f.name} ({', '.join(f.suffixes) or '*' + str(f.name_ends)})" for f in FORMATS if f.write is not None]
