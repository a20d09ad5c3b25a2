"""EMD files (``.emd``: Berkeley/NCEM EMD 0.2 and Thermo Fisher Velox), read lazily by ``rsciio.emd``.

An .emd is HDF5: it may hold no external link, virtual dataset or external raw storage
(stage.microscope.safety).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..safety import check_hdf5_file
from .base import FileFormat, ScanCalibrations
from .zspy import ALL, signal_dict


def write_emd(path: Path, data: Any, cal: ScanCalibrations) -> Path:
    """A Berkeley/NCEM EMD 0.2 file through rosettasciio's own writer (axes stored reversed, as it
    does), energy and semi-angle as attributes of its ``microscope`` group."""
    from rsciio.emd import file_writer

    file_writer(str(path), signal_dict(data, cal, tem_in_metadata=False))
    return path


FORMAT = FileFormat(name="EMD", module=__name__, suffixes=(".emd",), reader="rsciio.emd", check=check_hdf5_file,
                    write=write_emd, records=ALL)
