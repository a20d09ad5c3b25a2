"""Checks on a microscope file a user received that more than one format makes (`namsa reconstruct`).

A file must be read from itself only and be complete:

- HDF5 (.hspy, .hdf5, .h5, .emd, Arina): no external links, virtual datasets or external raw
  storage anywhere in the file (each would make the reader open another file, e.g. /etc/passwd,
  and use it as data). Soft links inside the file are fine.
- A file beside the input that its reader opens (a companion): no symbolic link, in the input's
  own folder (`refuse_companion_link`); a data file holds the bytes its header announces (`check_size`).
- Any format: real-valued data without NaN or +-inf (`check_values`, after reading).

The checks of one format alone are in its module (stage.microscope.formats: EMPAD's raw file,
a Merlin .mib's frames, a .zspy folder's links); each runs as its format's ``check``.
Every refusal is a `MicroscopeFileError` of one line naming the object and why.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import MicroscopeFileError, parser_message

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


def check_hdf5_file(path: Path) -> None:
    """An HDF5 input (.hspy, .emd) is self-contained: no external link anywhere (see above)."""
    check_hdf5_self_contained(path)


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
# files beside the input


def refuse_companion_link(companion: Path, owner: Path) -> None:
    """A companion file of ``owner`` that is a symbolic link, or lies in another folder, is refused."""
    if companion.is_symlink():
        raise MicroscopeFileError(f"{owner}: its companion file {companion} is a symbolic link (to "
                                  f"{os.path.realpath(companion)}); namsa reads only files in the input's folder: "
                                  "copy the file itself there")
    if os.path.lexists(companion) and companion.parent.resolve() != owner.parent.resolve():
        raise MicroscopeFileError(f"{owner}: its reader would open {companion}, outside the file's folder; rename "
                                  "the folder or the file so that its companion files lie beside it")


def check_size(path: Path, expected: int, why: str) -> None:
    """``path`` holds exactly ``expected`` bytes (``why``: where that number comes from)."""
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
