"""EMPAD files: an XML header (the input) and the raw file it names, read by ``rsciio.empad``.

The raw file lies in the header's own folder (no ``../``, no absolute path, no symbolic link) and
holds every frame the header announces, checked to the byte before rosettasciio reads it; a .raw
passed alone is refused (only its header gives the scan size).
"""
from __future__ import annotations

from pathlib import Path

from typing import Any

import numpy as np

from ..errors import ExperimentalInputError, MicroscopeFileError, parser_message
from ..safety import check_size, refuse_companion_link
from .base import FileFormat, ScanCalibrations

#: EMPAD frames: 128 x 128 float32 pattern rows plus 2 footer rows (rsciio.empad)
EMPAD_PX = 128
EMPAD_FRAME_BYTES = (EMPAD_PX + 2) * EMPAD_PX * 4
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


def write_empad(header: Path, data: Any, cal: ScanCalibrations) -> Path:
    """An EMPAD scan byte by byte from the layout rosettasciio reads: ``<stem>.raw`` beside the
    ``header`` holds one frame per probe position (row-major), each (128 + 2) x 128 little-endian
    float32, the pattern in the top 128 rows (a smaller pattern centred, k = 0 at pixel 64) above
    2 footer rows; the XML gives the scan size, the field of view [y, x] in metres and the detector
    pixel (``calibrated_pixelsize``, read as 1e9 x value 1/nm). EMPAD keeps no energy or angle."""
    sy, sx, ky, kx = data.shape
    if ky > EMPAD_PX or kx > EMPAD_PX:
        raise ExperimentalInputError(f"an EMPAD frame is {EMPAD_PX} x {EMPAD_PX} px; the patterns are {ky} x {kx}: "
                                     "crop or rebin them first")
    frames = np.zeros((sy * sx, EMPAD_PX + 2, EMPAD_PX), dtype="<f4")
    y0, x0 = EMPAD_PX // 2 - ky // 2, EMPAD_PX // 2 - kx // 2
    frames[:, y0: y0 + ky, x0: x0 + kx] = np.asarray(data, dtype=np.float32).reshape(sy * sx, ky, kx)
    raw = header.with_suffix(".raw")
    raw.write_bytes(frames.tobytes())
    optics = ""
    if cal.step_A is not None:
        fov_m = [abs(cal.step_A[0]) * sy * 1e-10, abs(cal.step_A[1]) * sx * 1e-10]
        optics = f"<optics><get_full_scan_field_of_view>{fov_m!r}</get_full_scan_field_of_view></optics>"
    pixel = "" if cal.dk_inv_A is None else f"<calibrated_pixelsize>{cal.dk_inv_A * 10 / 1e9!r}</calibrated_pixelsize>"
    header.write_text(f'<root><timestamp><isoformat>2026-01-01T00:00:00</isoformat></timestamp><pix_x>{sx}</pix_x>'
                      f'<pix_y>{sy}</pix_y><raw_file filename="{raw.name}"/><iom_measurements>{optics}{pixel}'
                      '</iom_measurements></root>')
    return header


# the raw file is held to the byte by check_empad: no declared-size ratio on top
FORMAT = FileFormat(name="EMPAD", module=__name__, suffixes=(".xml",), refused=((".raw", _RAW_ALONE),),
                    reader="rsciio.empad", check=check_empad, declared_size=False, write=write_empad,
                    records=("dk_inv_A", "step_A"))
