"""Quantum Detectors Merlin files (``.mib``, with the ``.hdr`` beside it), read by ``rsciio.quantumdetector``.

A .mib holds whole frames (header + pixels), as many as its .hdr announces (when there is one),
checked before rosettasciio reads it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MicroscopeFileError
from ..safety import check_size
from .base import FileFormat


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


FORMAT = FileFormat(name="Merlin", module=__name__, suffixes=(".mib",), reader="rsciio.quantumdetector",
                    check=check_mib_size, companions=mib_companions)
