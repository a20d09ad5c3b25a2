"""HyperSpy HDF5 files (``.hspy``, ``.hdf5``, ``.h5``): rosettasciio's reader, lazily, or h5py for
contiguous data.

rosettasciio 0.15 cannot read a contiguous (unchunked) dataset lazily (dask wants chunks), so such
a file is read with h5py in the .zspy layout (stage.microscope.formats.zspy); h5py slices a
contiguous dataset without reading the rest. The file may hold no external link, virtual dataset
or external raw storage (stage.microscope.safety).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ExperimentalInputError, parser_message
from ..safety import check_hdf5_file
from .base import FileFormat, ScanCalibrations, rsciio_read
from .zspy import ALL, hyperspy_signal, signal_dict

READER = "rsciio.hspy"


def write_hspy(path: Path, data: Any, cal: ScanCalibrations) -> Path:
    """A HyperSpy HDF5 file of ``data`` (scan_y, scan_x, ky, kx) through rosettasciio's own writer:
    scan axes in Angstrom, detector axes in 1/Angstrom, energy and semi-angle in ``metadata.
    Acquisition_instrument.TEM`` (what HyperSpy's ``Signal2D.save`` writes)."""
    from rsciio.hspy import file_writer

    file_writer(str(path), signal_dict(data, cal))
    return path


def read_hspy(path: Path) -> list[dict[str, Any]]:
    """The signals of a HyperSpy HDF5 file: contiguous data through h5py, chunked through rosettasciio."""
    return read_hspy_h5(path) if hspy_is_contiguous(path) else rsciio_read(path, READER, lazy=True)


def read_hspy_h5(path: Path) -> list[dict[str, Any]]:
    """The signals of a HyperSpy .hspy (HDF5) file read with h5py: the same layout as .zspy. Used
    for files whose data is stored contiguously (not chunked), which rosettasciio 0.15 cannot read
    lazily (dask wants chunks); h5py slices a contiguous dataset without reading the rest."""
    import h5py

    try:
        handle = h5py.File(path, "r")  # kept open: the data is sliced from it lazily
        experiments = handle["Experiments"]
        return [hyperspy_signal(experiments[name], _h5_groups) for name in sorted(_h5_groups(experiments))]
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


FORMAT = FileFormat(name="HyperSpy HDF5", module=__name__, suffixes=(".hspy", ".hdf5", ".h5"), reader=READER,
                    read=read_hspy, check=check_hdf5_file, write=write_hspy, records=ALL)
