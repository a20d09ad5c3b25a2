"""Counts in a scan: whether the data are counted electrons, the mean pattern at any dose, and the
one dose figure of a file.

A counting detector (Merlin, Arina, K3 in counting mode) records integers: every electron is one
count, so a pattern's total is the electrons it caught, whatever the mean (a scan at 3 e/Angstrom^2
and a 0.48 Angstrom step holds 0.7 electrons per pattern, half its patterns none). Such data are
counts at every dose, never "normalised". The dose is measured once per file, on the patterns as
read (before any crop or rebin to a model's detector): mean counts per pattern over the area of one
scan step, |step_y| x |step_x| (e/Angstrom^2; the electrons scattered off the detector are not
counted, so it is a lower bound). Integers from an integrating camera with a gain other than 1
count per electron overstate it by that gain; float data that are neither counts nor normalised
give no dose. Axis order: (scan_y, scan_x, ky, kx).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import autocal
from .disc import Disc

#: mean total intensity per pattern of normalised data (the model's convention: the incident
#: probe carries 1, minus what leaves the detector)
NORMALISED_TOTAL = (0.5, 1.05)
#: electrons a mean pattern must sum to before its disc is measured: the radius of a namsa
#: simulation's disc from 300 Poisson electrons was within 2% of the noise-free one, from 100 it
#: was half of it (the brightest pixel, not the disc); twice the margin
MIN_DISC_ELECTRONS = 1000


def is_counted(data: Any) -> bool:
    """Whether the scan holds counts: an integer dtype, or float values that are all whole numbers
    (16 patterns spread over the scan are looked at)."""
    if np.issubdtype(data.dtype, np.integer):
        return True
    sample = autocal.subsample(data, 16)
    return bool(np.all(sample == np.round(sample)))


def mean_pattern(data: Any, counted: bool, block_bytes: int) -> tuple[np.ndarray, float | None]:
    """(the (ky, kx) mean pattern, the electrons it was averaged from, None for uncounted data).

    From a strided subsample of the scan (autocal.subsample); counted data whose subsample holds
    fewer than `MIN_DISC_ELECTRONS` are averaged over every pattern instead (one more pass over
    the file, in blocks of ``block_bytes``), since a low-dose disc needs every electron."""
    sub = autocal.subsample(data)
    mean = sub.mean(axis=0)
    if not counted:
        return mean, None
    electrons = float(sub.sum())
    n = data.shape[0] * data.shape[1]
    if electrons < MIN_DISC_ELECTRONS and len(sub) < n:
        mean = scan_mean(data, block_bytes)
        electrons = float(mean.sum()) * n
    return mean, electrons


def scan_mean(data: Any, block_bytes: int = autocal.BLOCK_BYTES) -> np.ndarray:
    """The (ky, kx) mean of every pattern of the scan, read in blocks of at most ``block_bytes``."""
    total = np.zeros(data.shape[2:], dtype=np.float64)
    for y0, y1, x0, x1 in autocal.scan_blocks(data.shape, block_bytes):
        total += np.asarray(data[y0:y1, x0:x1], dtype=np.float64).sum(axis=(0, 1))
    return total / (data.shape[0] * data.shape[1])


def nominal_disc(mean: np.ndarray, radius_px: float | None) -> Disc:
    """A disc to window the patterns with when too few electrons show it: at the mean pattern's
    centre of intensity, of ``radius_px`` (from the calibrations), else a quarter of the detector."""
    ky, kx = mean.shape
    weights = np.clip(mean, 0.0, None)
    total = float(weights.sum())
    yy, xx = np.mgrid[:ky, :kx]
    centre = ((float((weights * yy).sum() / total), float((weights * xx).sum() / total)) if total > 0
              else (ky // 2, kx // 2))
    radius = radius_px if radius_px else min(ky, kx) / 4.0
    return Disc(centre_px=centre, radius_px=radius, radius_err_px=radius, roundness=1.0, second_spot=0.0,
                background=0.0, level=float(mean.max()))


def dose_record(total_per_pattern: float, counted: bool, step_A: tuple[float, float]) -> tuple[dict | None, str, str]:
    """(the dose measurement or None, a warning code, its message; both "" when there is a dose)."""
    if counted:
        dose = total_per_pattern / abs(step_A[0] * step_A[1])
        return ({"value": dose, "unit": "electrons/Angstrom^2", "counts_per_pattern": total_per_pattern,
                 "source": "counts per pattern of the file as read / (|step_y| x |step_x|)"}, "", "")
    if NORMALISED_TOTAL[0] <= total_per_pattern <= NORMALISED_TOTAL[1]:
        return None, "normalised", (f"the patterns carry {total_per_pattern:.3g} each: they look normalised, not "
                                    "counted, so no dose can be estimated")
    return None, "arbitrary-units", (f"the patterns carry {total_per_pattern:.4g} each in non-integer units: "
                                     "neither counts nor normalised (a camera's gain?), so no dose can be estimated")
