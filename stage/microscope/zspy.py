"""HyperSpy ``.zspy`` folders read with zarr 3 (lazily).

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


def _signal(group: Any) -> dict[str, Any]:
    axes = [dict(group[key].attrs) for key in sorted(group.group_keys()) if key.startswith("axis-")]
    return {"data": group["data"], "axes": axes, "metadata": _tree(group, "metadata"),
            "original_metadata": _tree(group, "original_metadata")}


def _tree(group: Any, name: str) -> dict[str, Any]:
    """A metadata group as nested dicts: each subgroup a dict, its attributes the leaves."""
    if name not in group:
        return {}
    node = group[name]
    out: dict[str, Any] = dict(node.attrs)
    for key in node.group_keys():
        out[key] = _tree(node, key)
    return out
