"""The mapping between a sample's target grid and py4DSTEM's object grid, both ways.

Target grid: (T, T) pixels [row = y, col = x] over the scanned field of view ``fov_A`` = [y0, x0,
height, width] (Angstrom), pixel (0, 0) at (y0, x0) (`namsa.targets`). Object grid: py4DSTEM's
padded, usually finer array (pixel size ``solver.sampling``, Angstrom), into which it shifts the
scan; the shift is read off the probe positions (ours in the specimen frame, py4DSTEM's
``solver.positions`` in the object frame, both Angstrom, unrefined). Reading a reconstruction back
(`object_coordinates` + `to_target_grid`) and writing a start into the solver (`target_coordinates`
+ `from_target_grid`) use the same shift, so the two are inverse up to interpolation.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from namsa.optics import scan_step_A
from namsa.sample_meta import SampleMeta


def _offset_A(scan_A: np.ndarray, solver_A: np.ndarray) -> np.ndarray:
    """(y, x) Angstrom to add to a specimen coordinate to get its object-frame coordinate."""
    return np.asarray(solver_A, dtype=np.float64).mean(axis=0) - np.asarray(scan_A, dtype=np.float64).mean(axis=0)


def _pixel_A(meta: SampleMeta, shape: Sequence[int]) -> tuple[float, float]:
    """Target pixel size (y, x) in Angstrom: the endpoint-exclusive step over the field of view."""
    return scan_step_A(meta.fov_A, shape)


def object_coordinates(meta: SampleMeta, shape: Sequence[int], scan_A: np.ndarray, solver_A: np.ndarray,
                       sampling: Sequence[float]) -> np.ndarray:
    """(2, T, T) fractional object-pixel coordinates of the target pixels of a (T, T) ``shape``."""
    y0, x0 = (float(v) for v in meta.fov_A[:2])
    py, px = _pixel_A(meta, shape)
    offset = _offset_A(scan_A, solver_A)
    ry = y0 + np.arange(shape[0]) * py
    rx = x0 + np.arange(shape[1]) * px
    yy, xx = np.meshgrid((ry + offset[0]) / sampling[0], (rx + offset[1]) / sampling[1], indexing="ij")
    return np.stack([yy, xx])


def target_coordinates(meta: SampleMeta, shape: Sequence[int], object_shape: Sequence[int], scan_A: np.ndarray,
                       solver_A: np.ndarray, sampling: Sequence[float]) -> np.ndarray:
    """(2, p, q) fractional target-pixel coordinates of the object pixels (the inverse of `object_coordinates`)."""
    y0, x0 = (float(v) for v in meta.fov_A[:2])
    py, px = _pixel_A(meta, shape)
    offset = _offset_A(scan_A, solver_A)
    ty = (np.arange(object_shape[0]) * sampling[0] - offset[0] - y0) / py
    tx = (np.arange(object_shape[1]) * sampling[1] - offset[1] - x0) / px
    yy, xx = np.meshgrid(ty, tx, indexing="ij")
    return np.stack([yy, xx])


def to_target_grid(phase: np.ndarray, coords: np.ndarray, sampling: Sequence[float], meta: SampleMeta,
                   shape: Sequence[int]) -> np.ndarray:
    """The object ``phase`` at the target pixels ``coords``: anti-aliased as skimage.transform.resize
    does (Gaussian sigma = (factor - 1) / 2 object pixels), then cubic interpolation."""
    from scipy.ndimage import gaussian_filter, map_coordinates

    py, px = _pixel_A(meta, shape)
    sigma = [max(0.0, (py / sampling[0] - 1.0) / 2.0), max(0.0, (px / sampling[1] - 1.0) / 2.0)]
    smooth = gaussian_filter(phase, sigma) if any(s > 0 for s in sigma) else phase
    return map_coordinates(smooth, coords, order=3, mode="nearest")


def from_target_grid(image: np.ndarray, coords: np.ndarray, sampling: Sequence[float], meta: SampleMeta,
                     periodic: bool) -> np.ndarray:
    """A (T, T) target-grid ``image`` at the object pixels ``coords`` (2, p, q): anti-aliased when the
    object pixel is the coarser, then cubic interpolation. Beyond the field of view: the image
    continued periodically (``periodic``: the field is one period of the specimen) or its mean."""
    from scipy.ndimage import gaussian_filter, map_coordinates

    image = np.asarray(image, dtype=np.float64)
    py, px = _pixel_A(meta, image.shape)
    sigma = [max(0.0, (sampling[0] / py - 1.0) / 2.0), max(0.0, (sampling[1] / px - 1.0) / 2.0)]
    mean = float(image.mean())
    # Deviations from the mean, so that the constant fill beyond the edge is the mean itself.
    dev = image - mean
    mode = "grid-wrap" if periodic else "grid-constant"
    if any(s > 0 for s in sigma):
        dev = gaussian_filter(dev, sigma, mode="wrap" if periodic else "constant")
    return map_coordinates(dev, coords, order=3, mode=mode, cval=0.0) + mean


__all__ = ["object_coordinates", "target_coordinates", "to_target_grid", "from_target_grid"]
