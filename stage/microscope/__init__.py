"""Microscope 4D-STEM files: reading them and calibrating them (the data room's part of `namsa reconstruct`).

1. `read_scan(path)` (files.py): a 4-D dataset (scan_y, scan_x, ky, kx), left in the file (`LazyScan`,
   scan.py: slices are read on demand), and the calibrations its metadata holds, through the format
   that claims it in the registry `FORMATS` (formats/, one module per format: rosettasciio,
   ``rsciio``, GPL-3.0, imported lazily: ``pip install -e '.[io]'``; or namsa's own lazy readers,
   formats/arina.py and formats/zspy.py), after the format's checks (safety.py and its module: the
   file is read from itself only and is complete). `from_datacube` (datacube.py) does the same for a
   py4DSTEM DataCube in memory.
2. `resolve_calibrations(found, given)` (calibration.py): beam energy (kV), convergence semi-angle
   (mrad), detector pixel size (1/Angstrom) and signed scan step (Angstrom); a value given on the
   command line wins over the file's; all missing ones are named in one line with their flags.
3. `check_before_inference(scan, given)` (checks.py, with autocal.py): the file against itself (a
   CBED disc, its radius, counts, saturation) and the calibration fitted from the data. Before it,
   `memory_problem` (memory.py) says from the header alone whether the least a reconstruction holds
   at once (one model tile of patterns, the checks' copies of one pattern) fits the memory budget.

4. `write_scan(path, data, calibrations)` (writers.py): the other way, a scan written in a format
   `read_scan` reads (.hspy, .zspy, .emd, EMPAD, Merlin, Arina), for microscope-like test data
   (namsa.camera records namsa's patterns as a detector would).

Fitting the scan to a model (expectation, resampling, the checks against its card, tiles) is
models.scan_fit; writing the maps is workflow.reconstruct_maps, the driver workflow.reconstruct.
Nothing here imports lmdb or torch. Axis conventions: a file's data is (scan_y, scan_x, ky, kx).
"""
from __future__ import annotations

from .autocal import DataCalibration
from .calibration import FLAGS, Calibrations, resolve_calibrations
from .checks import check_before_inference
from .datacube import as_raw_scan, from_datacube
from .errors import ExperimentalInputError, MicroscopeFileError
from .files import read_scan
from .formats import FORMATS
from .formats.base import ScanCalibrations
from .memory import memory_problem
from .safety import check_values
from .scan import LazyScan, RawScan
from .writers import write_scan

__all__ = ["read_scan", "RawScan", "LazyScan", "FORMATS", "from_datacube", "as_raw_scan", "resolve_calibrations",
           "Calibrations", "FLAGS", "check_values", "ExperimentalInputError", "MicroscopeFileError",
           "check_before_inference", "DataCalibration", "write_scan", "ScanCalibrations", "memory_problem"]
