"""Microscope 4D-STEM files -> the stack a trained reconstructor expects (`namsa reconstruct`).

Three steps, each a plain function:

1. `read_scan(path)` (files.py): a 4-D dataset (scan_y, scan_x, ky, kx) and the calibrations its
   metadata holds, through rosettasciio (``rsciio``, GPL-3.0, imported lazily: ``pip install -e '.[io]'``),
   after the checks of safety.py (the file is read from itself only and is complete).
2. `resolve_calibrations(found, given)` (calibration.py): beam energy (kV), convergence semi-angle
   (mrad), detector pixel size (1/Angstrom) and scan step (Angstrom); a value given on the command
   line wins over the file's; a missing one is a one-line error naming its flag.
3. `fit_to_model(scan, calibrations, expectation)` (fit.py): checks the physics against what the
   model was trained on (`model_expectation`, expectation.py), resamples the detector and the scan
   to the model's sampling, and cuts the scan into tiles of the model's scan shape.

Writing the maps is workflow.reconstruct_maps. Axis conventions: maps are [row = y, col = x]; a
file's data is (scan_y, scan_x, ky, kx); a model's stack is (S, P, P) with S = scan_y * scan_x
row-major and k = 0 at index P // 2 (the same convention is assumed for the file's detector:
centre its patterns first).
"""
from __future__ import annotations

from .autocal import DataCalibration
from .calibration import FLAGS, Calibrations, resolve_calibrations
from .checks import OutsideTrainingWarning, check_after_inference, check_before_inference
from .errors import ExperimentalInputError, MicroscopeFileError
from .expectation import ModelExpectation, model_expectation
from .files import READERS, RawScan, read_scan
from .fit import PHYSICS_RTOL, PreparedScan, fit_to_model, scan_block, stitch
from .safety import check_file, check_values

__all__ = ["read_scan", "RawScan", "READERS", "resolve_calibrations", "Calibrations", "FLAGS",
           "model_expectation", "ModelExpectation", "fit_to_model", "PreparedScan", "PHYSICS_RTOL",
           "stitch", "scan_block", "check_file", "check_values", "ExperimentalInputError",
           "MicroscopeFileError", "check_before_inference", "check_after_inference", "OutsideTrainingWarning",
           "DataCalibration"]
