"""HyperSpy ``.zspy`` folders, read with zarr 3 (lazily), and the HyperSpy layout .hspy shares.

rosettasciio 0.15 reads .zspy only through zarr 2 (its ``zspy`` extra pins ``zarr<3``), while abTEM,
which the test suite validates the simulator against, needs ``zarr>=3.1``: both cannot be installed
together. zarr 3 reads the zarr-2 format HyperSpy writes, so namsa reads the layout itself:
``Experiments/<title>/data`` is the array, ``axis-<i>`` groups carry each axis' attributes (name,
size, scale, offset, units, index_in_array) and ``metadata/...`` groups the metadata tree as
attributes. The result is the signal dict rosettasciio's readers return (``data`` a zarr array,
sliced lazily), so `calibrations_in` reads it like any other file. A symbolic link inside the
folder is refused before it is read (`check_zspy_folder`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ExperimentalInputError, MicroscopeFileError, parser_message
from .base import FileFormat


def read_zspy(path: Path) -> list[dict[str, Any]]:
    """The signals of a HyperSpy .zspy folder as rosettasciio-style dicts (data, axes, metadata,
    original_metadata); ExperimentalInputError for a folder that is not one."""
    import zarr

    try:
        experiments = zarr.open_group(str(path), mode="r", zarr_format=2)["Experiments"]
        return [hyperspy_signal(experiments[name]) for name in sorted(experiments.group_keys())]
    except Exception as exc:  # a damaged or foreign folder fails inside zarr in many ways
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as a HyperSpy .zspy folder ({text}); check it is "
                                     "complete (Experiments/<title>/data)") from None


def check_zspy_folder(path: Path) -> None:
    """A .zspy folder (zarr) holds its chunks itself: a symbolic link inside it (to /etc/passwd, or
    to another scan) would be read as data, so any link is refused."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                raise MicroscopeFileError(f"{path}: {os.path.join(root, name)} is a symbolic link; namsa reads only "
                                          "the chunks inside the .zspy folder: copy the data into it")


def _zarr_groups(group: Any) -> list[str]:
    return list(group.group_keys())


def hyperspy_signal(group: Any, groups: Any = _zarr_groups) -> dict[str, Any]:
    """One ``Experiments/<title>`` group (zarr, or h5py with ``groups`` listing its subgroups) as
    the signal dict rosettasciio returns; used by .hspy's contiguous reader too (formats.hspy)."""
    axes = [dict(group[key].attrs) for key in sorted(groups(group)) if key.startswith("axis-")]
    return {"data": group["data"], "axes": axes, "metadata": _tree(group, "metadata", groups),
            "original_metadata": _tree(group, "original_metadata", groups)}


def _tree(group: Any, name: str, groups: Any) -> dict[str, Any]:
    """A metadata group as nested dicts: each subgroup a dict, its attributes the leaves."""
    if name not in group:
        return {}
    node = group[name]
    out: dict[str, Any] = dict(node.attrs)
    for key in groups(node):
        out[key] = _tree(node, key, groups)
    return out


FORMAT = FileFormat(name="HyperSpy zarr", module=__name__, suffixes=(".zspy",), read=read_zspy,
                    check=check_zspy_folder, folder=True)
