"""Reading a microscope 4D-STEM file through rosettasciio: the file types and their readers."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import calibrations_in
from .errors import ExperimentalInputError
from .safety import check_file, check_values

#: file extension -> rosettasciio plugin module that reads it
READERS: dict[str, str] = {".hspy": "rsciio.hspy", ".hdf5": "rsciio.hspy", ".h5": "rsciio.hspy",
                           ".zspy": "rsciio.zspy", ".emd": "rsciio.emd", ".mib": "rsciio.quantumdetector",
                           ".xml": "rsciio.empad", ".raw": "rsciio.empad", ".dm4": "rsciio.digitalmicrograph",
                           ".dm3": "rsciio.digitalmicrograph", ".blo": "rsciio.blockfile"}


@dataclass
class RawScan:
    """A 4-D dataset as read: ``data`` (scan_y, scan_x, ky, kx) and calibrations found in the file.

    ``found`` maps a calibration name (energy_kv, semiangle_mrad, dk_inv_A, dk_mrad, step_A) to
    its value in those units; dk_* and step_A are (y, x) pairs.
    """

    data: np.ndarray
    found: dict[str, Any]
    path: str


def read_scan(path: str | Path) -> RawScan:
    """Read a 4-D STEM file through rosettasciio; the first 4-D dataset in it is used."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentalInputError(f"{path} does not exist or is not a file; pass a 4D-STEM file "
                                     f"({', '.join(sorted(READERS))})")
    check_file(path)  # before rsciio opens it: nothing outside the file is followed
    signals = _rsciio_read(path)
    four_d = [s for s in signals if np.ndim(s.get("data")) == 4]
    if not four_d:
        shapes = [tuple(np.shape(s.get("data"))) for s in signals]
        raise ExperimentalInputError(f"{path} holds no 4-D dataset (found shapes {shapes}); namsa reconstruct needs "
                                     "(scan_y, scan_x, ky, kx) data")
    signal = four_d[0]
    data = np.asarray(signal["data"])
    check_values(data, str(path))
    return RawScan(data=data, found=calibrations_in(signal), path=str(path))


def _rsciio_read(path: Path) -> list[dict[str, Any]]:
    import importlib

    module = READERS.get(path.suffix.lower())
    if module is None:
        raise ExperimentalInputError(f"{path}: unknown file type {path.suffix!r}; namsa reconstruct reads "
                                     f"{', '.join(sorted(READERS))} (convert other formats to .hspy)")
    try:
        reader = importlib.import_module(module).file_reader
    except ImportError:
        raise ExperimentalInputError("reading experimental files needs rosettasciio: pip install -e '.[io]'") from None
    try:
        kwargs = {"lazy": False} if module in ("rsciio.hspy", "rsciio.zspy", "rsciio.emd") else {}
        return list(reader(str(path), **kwargs))
    except Exception as exc:  # any parser failure of a foreign file is bad input
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ExperimentalInputError(f"{path} could not be read as {module.split('.')[-1]} ({text}); check the "
                                     "file is complete and of that format") from None

