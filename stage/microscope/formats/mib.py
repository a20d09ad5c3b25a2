"""Quantum Detectors Merlin files (``.mib``, with the ``.hdr`` beside it), read by ``rsciio.quantumdetector``.

A .mib holds whole frames (header + pixels), as many as its .hdr announces (when there is one),
checked before rosettasciio reads it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExperimentalInputError, MicroscopeFileError
from ..safety import check_size
from .base import FileFormat, ScanCalibrations


def mib_header(path: Path) -> Path:
    """The .hdr rosettasciio opens beside a .mib."""
    return Path(str(path).replace(".mib", ".hdr"))  # rsciio.quantumdetector's rule, verbatim


def mib_companions(path: Path) -> list[Path]:
    return [mib_header(path)]


def check_mib_size(path: Path) -> None:
    """A .mib holds whole frames (header + pixels), as many as its .hdr announces (when there is one)."""
    try:
        from rsciio.quantumdetector._api import MIBProperties, parse_hdr_file
    except ImportError:
        return
    props = MIBProperties()
    try:
        props.parse_file(str(path))
        frame = int(props.head_size) + int(np.prod(props.merlin_size)) * np.dtype(props.dtype).itemsize
    except Exception:  # not a .mib at all: the reader refuses it in one line
        return
    hdr = mib_header(path)  # the .hdr rsciio reads (stage.microscope.links has checked it is no link)
    frames = _hdr_frames(hdr, parse_hdr_file) if hdr.is_file() else None
    if frames:
        check_size(path, frames * frame, f"{frames} frames of {frame} bytes as {hdr.name} says")
    elif props.file_size % frame:
        whole = props.file_size // frame
        raise MicroscopeFileError(f"{path} is truncated: {props.file_size} bytes are {whole} whole frames of {frame} "
                                  f"bytes and {props.file_size - whole * frame} bytes of a cut frame; copy the "
                                  "file again (or re-export it from the acquisition)")


def _hdr_frames(hdr: Path, parse) -> int | None:
    try:
        return int(parse(str(hdr))["Frames in Acquisition (Number)"])
    except Exception:  # no usable count: the frames in the file decide
        return None


def write_mib(path: Path, data: Any, cal: ScanCalibrations) -> Path:
    """A Quantum Detectors Merlin ``.mib`` + ``.hdr`` byte by byte: per frame a 384-byte ASCII header
    (``MQ1,<frame>,00384,<chips>,<width>,<height>,U16,<geometry>,...``) then the frame as big-endian
    counts (U16, or U32 above 65,535), rows stored bottom-up (the reader flips them); the ``.hdr``
    gives the frames per trigger (scan_x) and in total. Merlin counts electrons: the data must be
    whole counts >= 0. A .mib keeps no calibration (`namsa reconstruct` takes them as flags)."""
    counts = np.asarray(data)
    if counts.size and (counts.min() < 0 or not np.array_equal(counts, np.round(counts))):
        raise ExperimentalInputError(f"{path}: a Merlin file holds counts; the data are not whole numbers >= 0 "
                                     "(record them with a counting camera: namsa.camera, gain 1, no read noise)")
    sy, sx, ky, kx = counts.shape
    wide = counts.size and counts.max() > np.iinfo(np.uint16).max
    kind, dtype = ("U32", ">u4") if wide else ("U16", ">u2")
    chunks = []
    for i, frame in enumerate(counts.reshape(sy * sx, ky, kx)):
        fields = ["MQ1", f"{i + 1:06d}", "00384", "01", f"{kx:05d}", f"{ky:05d}", kind, "   1x1", "01",
                  "2026-01-01T00:00:00.000000000Z", "1000000ns", "0", ""]
        chunks.append(",".join(fields).ljust(384).encode() + frame[::-1].astype(dtype).tobytes())
    path.write_bytes(b"".join(chunks))
    mib_header(path).write_text(f"HDR,\t\nFrames in Acquisition (Number):\t{sy * sx}\n"
                                f"Frames per Trigger (Number):\t{sx}\nEnd\t\n")
    return path


FORMAT = FileFormat(name="Merlin", module=__name__, suffixes=(".mib",), reader="rsciio.quantumdetector",
                    check=check_mib_size, companions=mib_companions, write=write_mib)
