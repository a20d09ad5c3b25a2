"""HyperSpy ``.zspy`` folders read with zarr 3, and contiguous ``.hspy`` files with h5py (lazily).

rosettasciio 0.15 reads .zspy only through zarr 2 (its ``zspy`` extra pins ``zarr<3``), while abTEM,
which the test suite validates the simulator against, needs ``zarr>=3.1``: both cannot be installed
together. zarr 3 reads the zarr-2 format HyperSpy writes, so namsa reads the layout itself:
``Experiments/<title>/data`` is the array, ``axis-<i>`` groups carry each axis' attributes (name,
size, scale, offset, units, index_in_array) and ``metadata/...`` groups the metadata tree as
attributes. The result is the signal dict rosettasciio's readers return (``data`` a zarr array,
sliced lazily), so `calibrations_in` reads it like any other file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ExperimentalInputError, parser_message


def read_zspy(path: Path) -> list[dict[str, Any]]:
    """The signals of a HyperSpy .zspy folder as rosettasciio-style dicts (data, axes, metadata,
    original_metadata); ExperimentalInputError for a folder that is not one."""
    import zarr

    try:
        experiments = zarr.open_group(str(path), mode="r", zarr_format=2)["Experiments"]
        return [_signal(experiments[name]) for name in sorted(experiments.group_keys())]
    except Exception as exc:  # a damaged or foreign folder fails inside zarr in many ways
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as a HyperSpy .zspy folder ({text}); check it is "
                                     "complete (Experiments/<title>/data)") from None


def read_hspy_h5(path: Path) -> list[dict[str, Any]]:
    """The signals of a HyperSpy .hspy (HDF5) file read with h5py: the same layout as .zspy. Used
    for files whose data is stored contiguously (not chunked), which rosettasciio 0.15 cannot read
    lazily (dask wants chunks); h5py slices a contiguous dataset without reading the rest."""
    import h5py

    try:
        handle = h5py.File(path, "r")  # kept open: the data is sliced from it lazily
        experiments = handle["Experiments"]
        return [_signal(experiments[name], _h5_groups) for name in sorted(_h5_groups(experiments))]
    except Exception as exc:  # a damaged or foreign file fails inside h5py in many ways
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as hspy ({text}); check the file is complete "
                                     "(Experiments/<title>/data)") from None


def hspy_is_contiguous(path: Path) -> bool:
    """Whether a .hspy file's first signal keeps its data contiguous (unchunked) in the file."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            experiments = handle["Experiments"]
            first = experiments[sorted(_h5_groups(experiments))[0]]["data"]
            return isinstance(first, h5py.Dataset) and first.chunks is None
    except Exception:  # not such a file: rosettasciio's reader says what is wrong
        return False


def _h5_groups(group: Any) -> list[str]:
    import h5py

    return [key for key in group if isinstance(group.get(key), h5py.Group)]


def _zarr_groups(group: Any) -> list[str]:
    return list(group.group_keys())


def _signal(group: Any, groups: Any = _zarr_groups) -> dict[str, Any]:
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
