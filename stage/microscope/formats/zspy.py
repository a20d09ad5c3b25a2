"""HyperSpy ``.zspy`` folders, read with zarr 3 (lazily), and the HyperSpy layout .hspy shares.

rosettasciio 0.15 reads .zspy only through zarr 2 (its ``zspy`` extra pins ``zarr<3``), while abTEM,
which the test suite validates the simulator against, needs ``zarr>=3.1``: both cannot be installed
together. zarr 3 reads the zarr-2 format HyperSpy writes, so namsa reads the layout itself:
``Experiments/<title>/data`` is the array, ``axis-<i>`` groups carry each axis' attributes (name,
size, scale, offset, units, index_in_array) and ``metadata/...`` groups the metadata tree as
attributes. The result is the signal dict rosettasciio's readers return (``data`` a zarr array,
sliced lazily), so `calibrations_in` reads it like any other file. A symbolic link inside the
folder is refused before it is read (`check_zspy_folder`), and so is a 4-D dataset with chunk files
missing (`check_zspy_chunks`: zarr would read them as zeros). `write_zspy` writes that layout, and
`signal_dict` is the signal dict of a scan the HyperSpy writers (.hspy, .emd) share.
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from ..errors import ExperimentalInputError, MicroscopeFileError, parser_message
from .base import FileFormat, ScanCalibrations

#: every calibration: HyperSpy's layout keeps them all (axes' scales and units, the TEM metadata)
ALL = ("energy_kv", "semiangle_mrad", "dk_inv_A", "step_A")
#: missing chunk files a refusal names (the rest are counted)
NAMED_CHUNKS = 3


def read_zspy(path: Path) -> list[dict[str, Any]]:
    """The signals of a HyperSpy .zspy folder as rosettasciio-style dicts (data, axes, metadata,
    original_metadata); ExperimentalInputError for a folder that is not one."""
    import zarr

    try:
        experiments = zarr.open_group(str(path), mode="r", zarr_format=2)["Experiments"]
        signals = [hyperspy_signal(experiments[name]) for name in sorted(experiments.group_keys())]
    except Exception as exc:  # a damaged or foreign folder fails inside zarr in many ways
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as a HyperSpy .zspy folder ({text}); check it is "
                                     "complete (Experiments/<title>/data)") from None
    for signal in signals:
        if len(signal["data"].shape) == 4:  # a scan (the only data namsa reads)
            check_zspy_chunks(path, signal["data"])
    return signals


def check_zspy_chunks(path: Path, array: Any) -> None:
    """Refuse a zarr ``array`` of the folder ``path`` whose chunk files are not all there.

    zarr reads a missing chunk as the fill value without a word, so a folder copied in part would
    be reconstructed with scan rows of zeros that look like blanked frames. HyperSpy's writer (zarr 2)
    stores every chunk, empty ones too, and so does `write_zspy`: a missing file is lost data."""
    folder = Path(path, *array.path.split("/"))
    stored = {os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
              for root, _, names in os.walk(folder) for name in names if not name.startswith(".")}
    grid = list(itertools.product(*(range(n) for n in array.cdata_shape)))
    missing = [c for c in grid if array.metadata.encode_chunk_key(c) not in stored]
    if not missing:
        return
    keys = [array.metadata.encode_chunk_key(c) for c in missing[:NAMED_CHUNKS]]
    raise MicroscopeFileError(f"{path}: {len(missing)} of the {len(grid)} chunk files of {array.path} are missing "
                              f"({', '.join(keys)}{', ...' if len(missing) > NAMED_CHUNKS else ''}; "
                              f"{_scan_rows(array, missing)}): zarr would fill them in with "
                              f"{0 if array.fill_value is None else array.fill_value}, which is lost data, not "
                              "blanked frames; the folder was copied or written incompletely: copy it again from the "
                              "original")


def _scan_rows(array: Any, chunks: list[tuple[int, ...]]) -> str:
    """The scan rows (first axis) the chunks at grid coordinates ``chunks`` hold, as ranges in words."""
    step, ranges = array.chunks[0], []
    for first in sorted({c[0] * step for c in chunks}):
        last = min(array.shape[0], first + step) - 1
        if ranges and ranges[-1][1] == first - 1:
            ranges[-1][1] = last
        else:
            ranges.append([first, last])
    words = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:NAMED_CHUNKS]]
    return "scan rows " + ", ".join(words) + (", ..." if len(ranges) > NAMED_CHUNKS else "")


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


def write_zspy(path: Path, data: Any, cal: ScanCalibrations) -> Path:
    """A HyperSpy .zspy folder in the zarr-2 layout rosettasciio's writer makes (tests/data/
    hyperspy-written.zspy is one it made): root attributes ``file_format`` ZSpy 3.3,
    ``Experiments/scan`` with ``axis-<i>`` groups, the ``data`` array chunked one scan row at a
    time, and ``metadata`` groups; written with zarr 3 (rsciio's writer needs zarr 2)."""
    import zarr

    signal = signal_dict(data, cal)
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    root.attrs.update({"file_format": "ZSpy", "file_format_version": "3.3"})
    group = root.create_group("Experiments").create_group("scan")
    group.attrs.update(signal["package_info"])
    for i, axis in enumerate(signal["axes"]):
        group.create_group(f"axis-{i}").attrs.update(axis)
    # every chunk stored, empty ones too (zarr 3 skips them by default), as HyperSpy's zarr-2 writer does: a
    # missing chunk file then always means lost data (check_zspy_chunks), never a blanked scan row
    array = group.create_array("data", shape=data.shape, dtype=data.dtype, chunks=(1, *data.shape[1:]),
                               config={"write_empty_chunks": True})
    array[...] = data
    _write_tree(group.create_group("metadata"), signal["metadata"])
    for name in ("original_metadata", "learning_results", "attributes"):
        group.create_group(name)
    return path


def signal_dict(data: Any, cal: ScanCalibrations, tem_in_metadata: bool = True) -> dict[str, Any]:
    """The rosettasciio signal dict of a 4-D scan with ``cal``: an unknown scale gets no unit (no
    calibration); ``tem_in_metadata`` False puts energy and semi-angle in ``original_metadata.
    microscope`` instead (where EMD (NCEM) files keep them)."""
    import numpy as np

    step = cal.step_A or (None, None)

    def axis(i: int, name: str, scale: float | None, unit: str) -> dict[str, Any]:
        return {"name": name, "size": int(data.shape[i]), "offset": 0.0, "scale": 1.0 if scale is None else scale,
                "units": "" if scale is None else unit, "navigate": i < 2, "index_in_array": i}

    tem = {k: v for k, v in (("beam_energy", cal.energy_kv), ("convergence_angle", cal.semiangle_mrad)) if v}
    return {"data": np.ascontiguousarray(data),
            "axes": [axis(0, "y", step[0], "Å"), axis(1, "x", step[1], "Å"),
                     axis(2, "ky", cal.dk_inv_A, "1/Å"), axis(3, "kx", cal.dk_inv_A, "1/Å")],
            "metadata": {"General": {"title": "scan"}, "Signal": {"signal_type": ""},
                         "Acquisition_instrument": {"TEM": tem if tem_in_metadata else {}}},
            "original_metadata": {} if tem_in_metadata else {"microscope": tem}, "tmp_parameters": {},
            "attributes": {"_lazy": False}, "learning_results": {}, "models": {},
            "package_info": {"name": "namsa", "version": "0"}}


def _write_tree(group: Any, tree: dict[str, Any]) -> None:
    """Nested dicts as groups, their other values as the group's attributes (what `_tree` reads)."""
    group.attrs.update({k: v for k, v in tree.items() if not isinstance(v, dict)})
    for key, value in tree.items():
        if isinstance(value, dict):
            _write_tree(group.create_group(key), value)


FORMAT = FileFormat(name="HyperSpy zarr", module=__name__, suffixes=(".zspy",), read=read_zspy,
                    check=check_zspy_folder, folder=True, write=write_zspy, records=ALL)
