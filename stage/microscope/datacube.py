"""A py4DSTEM DataCube in memory -> a `RawScan` with the calibrations it carries (Python API)."""
from __future__ import annotations

from typing import Any

from .calibration import calibrations_in
from .errors import ExperimentalInputError
from .files import read_scan
from .scan import LazyScan, RawScan

#: py4DSTEM unit names -> the names stage.microscope.calibration reads
_UNITS = {"A": "A", "nm": "nm", "A^-1": "1/A", "nm^-1": "1/nm", "mrad": "mrad"}


def from_datacube(datacube: Any, name: str = "py4DSTEM DataCube") -> RawScan:
    """A py4DSTEM DataCube (data (Rx, Ry, Qx, Qy): scan y, scan x, ky, kx as namsa reads it) with
    its R and Q pixel sizes (Angstrom or nm; 1/Angstrom, 1/nm or mrad) and convergence semi-angle;
    a unit of ``pixels`` is no calibration. py4DSTEM keeps no beam energy: give ``energy_kv``."""
    data = getattr(datacube, "data", None)
    if getattr(data, "ndim", 0) != 4:
        raise ExperimentalInputError(f"{name} holds no 4-D data (shape {getattr(data, 'shape', None)}); "
                                     "namsa reconstruct needs (scan_y, scan_x, ky, kx) data")
    cal = datacube.calibration
    r_size, r_unit = cal.get_R_pixel_size(), _UNITS.get(str(cal.get_R_pixel_units()), "")
    q_size, q_unit = cal.get_Q_pixel_size(), _UNITS.get(str(cal.get_Q_pixel_units()), "")
    axes = [{"index_in_array": i, "scale": r_size if i < 2 else q_size, "units": r_unit if i < 2 else q_unit}
            for i in range(4)]
    semiangle = cal.get_convergence_semiangle_mrad() if hasattr(cal, "get_convergence_semiangle_mrad") else None
    tem = {"convergence_angle": semiangle} if semiangle else {}
    signal = {"axes": axes, "metadata": {"Acquisition_instrument": {"TEM": tem}}}
    return RawScan(data=LazyScan(data, name), found=calibrations_in(signal), path=name)


def as_raw_scan(source: Any) -> RawScan:
    """A `RawScan` from a file path, a RawScan, or a py4DSTEM DataCube (anything with ``calibration``)."""
    if isinstance(source, RawScan):
        return source
    if hasattr(source, "calibration") and hasattr(source, "data"):
        return from_datacube(source)
    return read_scan(source)
