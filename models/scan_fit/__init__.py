"""Fitting a microscope scan to a trained reconstructor (`namsa reconstruct`): the model's side of it.

Reading and calibrating the file is stage.microscope (the data room); here, with the model's typed
card (`models.card.ModelCard`):

1. `model_expectation(card)` (expectation.py): the physics and sampling the model was trained on,
   from its card's ``expects_input`` (namsa.sampling.config_sampling).
2. `plan_fit(shape, calibrations, expectation)` (fit.py): checks the physics against it and decides
   how the detector and the scan are resampled to the model's sampling; `read_fitted` applies it to
   one block, `normalise_tile` scales a tile to the training intensity.
3. `tile_grid` / `blocks` / `Stitcher` (tiles.py): overlapping tiles of the model's scan shape,
   read in blocks within a memory budget, blended with raised-cosine weights (no seams).
4. `check_after_inference`, `input_report` (card_checks.py): the maps and a stack against the card.
5. `trained_ranges(card)` (trained_ranges.py): one figure per training range (focus on the specimen's
   middle, thickness, probe step, dose), the one every warning, the fit and the docs' table read.

Axis conventions: maps are [row = y, col = x]; a file's data is (scan_y, scan_x, ky, kx); a model's
stack is (S, P, P) with S = scan_y * scan_x row-major and k = 0 at index P // 2.
"""
from __future__ import annotations

from .card_checks import OutsideTrainingWarning, check_after_inference, input_report
from .expectation import ModelExpectation, model_expectation
from .fit import PHYSICS_RTOL, FitPlan, PatternTransform, normalise_tile, plan_fit, read_fitted, sampling_problems
from .tiles import Block, Stitcher, TileGrid, blocks, tile_grid, tile_margin
from .trained_ranges import TrainedRange, TrainedRanges, trained_dose_range, trained_ranges

__all__ = ["model_expectation", "ModelExpectation", "plan_fit", "read_fitted", "normalise_tile", "FitPlan",
           "PatternTransform", "PHYSICS_RTOL", "sampling_problems", "tile_grid", "TileGrid", "blocks", "Block", "Stitcher", "tile_margin",
           "check_after_inference", "input_report", "trained_dose_range", "OutsideTrainingWarning", "TrainedRange",
           "TrainedRanges", "trained_ranges"]
