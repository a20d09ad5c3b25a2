"""EMD files (``.emd``: Berkeley/NCEM EMD 0.2 and Thermo Fisher Velox), read lazily by ``rsciio.emd``.

An .emd is HDF5: it may hold no external link, virtual dataset or external raw storage
(stage.microscope.safety).
"""
from __future__ import annotations

from ..safety import check_hdf5_file
from .base import FileFormat

FORMAT = FileFormat(name="EMD", module=__name__, suffixes=(".emd",), reader="rsciio.emd", check=check_hdf5_file)
