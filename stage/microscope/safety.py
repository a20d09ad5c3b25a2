"""Checks on a microscope file a user received, made before rosettasciio reads it (`namsa reconstruct`).

A file must be read from itself only and be complete:

- HDF5 (.hspy, .hdf5, .h5, .emd): no external links, virtual datasets or external raw storage
  anywhere in the file (each would make the reader open another file, e.g. /etc/passwd, and
  use it as data). Soft links inside the file are fine.
- EMPAD (.xml + .raw): the header's raw file lies in the header's own folder (no ``../``, no
  absolute path, no symbolic link) and holds every frame the header announces.
- Merlin (.mib): whole frames only, and as many as its .hdr announces.
- Any format: real-valued data without NaN or +-inf (`check_values`, after reading).

- zarr (.zspy, a folder of chunk files): no symbolic link anywhere inside the folder.

Every refusal is a `MicroscopeFileError` of one line naming the object and why.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import MicroscopeFileError, parser_message
from .links import companions, refuse_companion_link

HDF5_SUFFIXES = frozenset({".hspy", ".hdf5", ".h5", ".emd"})
#: EMPAD frames: 128 x 128 float32 pattern rows plus 2 footer rows (rsciio.empad)
EMPAD_FRAME_BYTES = 130 * 128 * 4


def check_file(path: Path) -> None:
    """The checks that apply to ``path``'s format (see the module docstring); silent when it passes."""
    suffix = path.suffix.lower()
    if suffix in HDF5_SUFFIXES:
        check_hdf5_self_contained(path)
    elif suffix == ".xml":
        check_empad(path)
    elif suffix == ".mib":
        check_mib_size(path)
    elif suffix == ".zspy":
        check_zspy_folder(path)


def check_zspy_folder(path: Path) -> None:
    """A .zspy folder (zarr) holds its chunks itself: a symbolic link inside it (to /etc/passwd, or
    to another scan) would be read as data, so any link is refused."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                raise MicroscopeFileError(f"{path}: {os.path.join(root, name)} is a symbolic link; namsa reads only "
                                          "the chunks inside the .zspy folder: copy the data into it")


# --------------------------------------------------------------------------------------------
# HDF5


def check_hdf5_self_contained(path: Path, links_in: str | None = None) -> list["h5py.ExternalLink"]:
    """Walk every group of an HDF5 file (hard links, each object once) and refuse external links,
    virtual datasets and datasets with external raw storage. A file that is not HDF5 passes (the
    reader then says it cannot read it). ``links_in``: the one group (e.g. an Arina master's
    ``/entry/data``) whose direct members may be external links; they are returned for the caller
    to check, never followed here."""
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError:
        return []
    try:
        with handle:
            return _walk(handle, path, links_in)
    except MicroscopeFileError:
        raise
    except Exception as exc:  # a damaged file fails inside h5py in many ways: all are bad input
        text = parser_message(exc)
        raise MicroscopeFileError(f"{path}: its HDF5 structure could not be read ({text}); check the file is "
                                  "complete (copy it again)") from None


def _walk(root: "h5py.File", path: Path, links_in: str | None) -> list["h5py.ExternalLink"]:
    import h5py

    seen = {root.id}
    stack = [root]
    allowed: list[h5py.ExternalLink] = []
    while stack:  # iterative: a hostile file can nest groups deeper than Python's recursion limit
        group = stack.pop()
        for name in group:
            where = f"{group.name.rstrip('/')}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink) and group.name == links_in:
                allowed.append(link)
            elif isinstance(link, h5py.ExternalLink):
                raise MicroscopeFileError(f"{path}: {where} is an external link to {link.filename}:{link.path}; namsa "
                                          "reads only the file it is given: save the data into this file itself")
            if isinstance(link, h5py.SoftLink):
                continue  # a path inside this file; its target is walked where it is hard-linked
            obj = group.get(name)
            if isinstance(obj, h5py.Dataset):
                _check_dataset(obj, where, path)
            elif isinstance(obj, h5py.Group) and obj.id not in seen:
                seen.add(obj.id)
                stack.append(obj)
    return allowed


def _check_dataset(dataset: "h5py.Dataset", where: str, path: Path) -> None:
    if dataset.is_virtual:
        sources = sorted({s.file_name for s in dataset.virtual_sources()})
        raise MicroscopeFileError(f"{path}: dataset {where} is virtual (its data is read from {', '.join(sources)}); "
                                  "namsa reads only the file it is given: save the data into this file itself")
    if dataset.external is not None:
        files = sorted({str(entry[0]) for entry in dataset.external})
        raise MicroscopeFileError(f"{path}: dataset {where} keeps its raw data in external file(s) "
                                  f"{', '.join(files)}; namsa reads only the file it is given: save the data "
                                  "into this file itself")


# --------------------------------------------------------------------------------------------
# EMPAD


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
    _check_size(raw, frames * EMPAD_FRAME_BYTES, f"{frames} frames of {EMPAD_FRAME_BYTES} bytes as {header.name} says")


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


# --------------------------------------------------------------------------------------------
# Merlin .mib


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
    hdr = companions(path)[0]  # the .hdr rsciio reads (stage.microscope.links has checked it is no link)
    frames = _hdr_frames(hdr, parse_hdr_file) if hdr.is_file() else None
    if frames:
        _check_size(path, frames * frame, f"{frames} frames of {frame} bytes as {hdr.name} says")
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


def _check_size(path: Path, expected: int, why: str) -> None:
    actual = os.path.getsize(path)
    if actual != expected:
        state = "truncated" if actual < expected else "longer than announced"
        raise MicroscopeFileError(f"{path} is {state}: expected {expected} bytes ({why}), found {actual}; copy the "
                                  "file again (or re-export it from the acquisition)")


# --------------------------------------------------------------------------------------------
# values


def check_values(data: np.ndarray, path: str, origin: tuple[int, int] = (0, 0)) -> None:
    """Real-valued intensities without NaN or +-inf; ``data`` is (scan_y, scan_x, ky, kx), a block
    of the scan starting at scan position ``origin`` (y, x) (the position reported is the scan's)."""
    if data.dtype.kind not in "biuf":
        raise MicroscopeFileError(f"{path}: the 4-D dataset holds {data.dtype} values; namsa needs real-valued "
                                  "intensities (integer or float counts)")
    if data.dtype.kind != "f":
        return
    bad = ~np.isfinite(data)
    count = int(np.count_nonzero(bad))
    if count:
        nan = int(np.count_nonzero(np.isnan(data)))
        y, x, ky, kx = (int(i) for i in np.unravel_index(int(np.argmax(bad)), data.shape))
        y, x = y + origin[0], x + origin[1]
        raise MicroscopeFileError(f"{path}: {count} pixel value(s) are not finite ({nan} NaN, {count - nan} +-inf), "
                                  f"the first at scan position (y={y}, x={x}), detector pixel (ky={ky}, kx={kx}); "
                                  "replace them (e.g. with 0 or their neighbours' mean, as a dead-pixel mask does) "
                                  "and save the file again")
