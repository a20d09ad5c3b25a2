"""EMPAD files: an XML header (the input) and the raw file it names, read by ``rsciio.empad``.

The raw file lies in the header's own folder (no ``../``, no absolute path, no symbolic link) and
holds every frame the header announces, checked to the byte before rosettasciio reads it; a .raw
passed alone is refused (only its header gives the scan size).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import MicroscopeFileError, parser_message
from ..safety import check_size, refuse_companion_link
from .base import FileFormat

#: EMPAD frames: 128 x 128 float32 pattern rows plus 2 footer rows (rsciio.empad)
EMPAD_FRAME_BYTES = 130 * 128 * 4
_RAW_ALONE = ("an EMPAD .raw file is read through its XML header, which names it and gives the scan size: pass the "
              ".xml beside it")


def check_empad(header: Path) -> None:
    """The raw file an EMPAD header names lies in the header's folder and holds every frame."""
    try:
        from rsciio.empad._api import _parse_xml  # rsciio's own reading of the header
    except ImportError:
        return  # stage.microscope.read_scan says how to install rosettasciio
    try:
        _, info = _parse_xml(str(header))
    except Exception as exc:  # a foreign header fails in many ways: all are bad input
        text = parser_message(exc)
        raise MicroscopeFileError(f"{header} could not be read as an EMPAD header ({text}); check the file") from None
    raw = empad_raw_file(header, str(info["raw_filename"]))
    frames = int(info["series_count"]) if "series_count" in info else int(info["scan_y"]) * int(info["scan_x"])
    check_size(raw, frames * EMPAD_FRAME_BYTES, f"{frames} frames of {EMPAD_FRAME_BYTES} bytes as {header.name} says")


def empad_raw_file(header: Path, name: str) -> Path:
    """The raw file ``name`` beside ``header``: a plain file name of a file (not a symbolic link) in
    the header's folder; anything else (``../``, an absolute path, a symlink) is refused."""
    folder = header.parent  # where rsciio looks for it
    if not name or Path(name).name != name or name in (".", ".."):
        raise MicroscopeFileError(f"{header}: its raw file {name!r} is not a plain file name beside the header; "
                                  "namsa reads only the raw file in the header's folder: put it there and name it "
                                  "in the header")
    raw = folder / name
    refuse_companion_link(raw, header)
    if not raw.is_file():
        raise MicroscopeFileError(f"{header}: its raw file {raw} does not exist; copy it beside the header")
    return raw


# the raw file is held to the byte by check_empad: no declared-size ratio on top
FORMAT = FileFormat(name="EMPAD", module=__name__, suffixes=(".xml",), refused=((".raw", _RAW_ALONE),),
                    reader="rsciio.empad", check=check_empad, declared_size=False)
