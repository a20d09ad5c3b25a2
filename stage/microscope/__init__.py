"""Microscope 4D-STEM files -> the stack a trained reconstructor expects (`namsa reconstruct`).

Four steps, each a plain function:

1. `read_scan(path)` (files.py): a 4-D dataset (scan_y, scan_x, ky, kx), left in the file (`LazyScan`:
   slices are read on demand), and the calibrations its metadata holds, through rosettasciio
   (``rsciio``, GPL-3.0, imported lazily: ``pip install -e '.[io]'``), after the checks of
   safety.py (the file is read from itself only and is complete). `from_datacube` (datacube.py)
   does the same for a py4DSTEM DataCube in memory.
2. `resolve_calibrations(found, given)` (calibration.py): beam energy (kV), convergence semi-angle
   (mrad), detector pixel size (1/Angstrom) and signed scan step (Angstrom); a value given on the
   command line wins over the file's; all missing ones are named in one line with their flags.
3. `plan_fit(shape, calibrations, expectation)` (fit.py): checks the physics against what the
   model was trained on (`model_expectation`, expectation.py) and decides how the detector and the
   scan are resampled to the model's sampling; `read_fitted` applies it to one block.
4. `tile_grid` / `blocks` / `Stitcher` (tiles.py): overlapping tiles of the model's scan shape,
   read in blocks within a memory budget, blended with raised-cosine weights (no seams).

Writing the maps is workflow.reconstruct_maps, the driver workflow.reconstruct. Axis conventions:
maps are [row = y, col = x]; a file's data is (scan_y, scan_x, ky, kx); a model's stack is (S, P, P)
with S = scan_y * scan_x row-major and k = 0 at index P // 2 (the same convention is assumed for
the file's detector: centre its patterns first).
"""
from __future__ import annotations

from .autocal import DataCalibration
from .calibration import FLAGS, Calibrations, resolve_calibrations
from .checks import OutsideTrainingWarning, check_after_inference, check_before_inference
from .datacube import as_raw_scan, from_datacube
from .errors import ExperimentalInputError, MicroscopeFileError
from .expectation import ModelExpectation, model_expectation
from .files import READERS, LazyScan, RawScan, read_scan
from .fit import PHYSICS_RTOL, FitPlan, PatternTransform, normalise_tile, plan_fit, read_fitted
from .safety import check_file, check_values
from .tiles import Block, Stitcher, TileGrid, blocks, hann_weights, tile_grid

__all__ = ["read_scan", "RawScan", "LazyScan", "READERS", "from_datacube", "as_raw_scan", "resolve_calibrations",
           "Calibrations", "FLAGS", "model_expectation", "ModelExpectation", "plan_fit", "read_fitted",
           "normalise_tile", "FitPlan", "PatternTransform", "PHYSICS_RTOL", "tile_grid", "TileGrid", "blocks",
           "Block", "Stitcher", "hann_weights", "check_file", "check_values", "ExperimentalInputError",
           "MicroscopeFileError", "check_before_inference", "check_after_inference",
           "OutsideTrainingWarning", "DataCalibration"]
