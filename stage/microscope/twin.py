"""The 180-degree twin of a fitted scan rotation: which of theta and theta + 180 degrees turns the
patterns into the scan frame (stage.microscope.autocal fits theta modulo 180 from the curl-free
centre-of-mass field; the curl of -F is -curl F, so that condition cannot tell the two apart).

Rule (measured on namsa simulations of NiO [011], Cu2O [011] and [001], 40-150 Angstrom, probe
focus -40, 0, +40 Angstrom: scripts/rotation_twin_table.py, docs in the report of issue 42):

1. **Bright-field parallax** (`bf_parallax`, used when its sign is 3 standard errors from 0). The
   image seen through one bright-field pixel k is the specimen seen along the beam tilted by k
   (reciprocity): an object a height dz below the probe's focus appears shifted by -dz lambda k in
   the scan, so every bright-field pixel's image is the mean bright-field image shifted by P k,
   P = -dz lambda (R the rotation to the scan frame). With the probe focused on the entrance surface
   or above the specimen's mid-plane (namsa's C1 = 0, and how ADF images are focused) dz > 0 for the
   bulk of the specimen, and dz grows with thickness: the sign does not flip where channelling
   reverses the centre-of-mass contrast (NiO [011] at 60 and 150 Angstrom), it only gets larger. It
   is wrong when the probe is focused into the specimen's lower half (40 Angstrom underfocus on a
   40-60 Angstrom crystal), where the parallax is small against the crystal's thickness.
2. **Centre of mass against the annular dark field** (`com_score`, when the parallax is not
   measurable: a thin specimen focused near its middle, where it holds): the integrated CoM (the
   projected potential, up to a positive factor, for a thin specimen) correlates positively with the
   dark-field image (atoms attract the beam and scatter it out of the disc). Channelling and a
   defocus reverse this contrast in thick crystals, so it is the fallback, not the rule.

Axis order everywhere: data (scan_y, scan_x, ky, kx); vectors [y, x] / [ky, kx].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: bright-field pixels within this fraction of the disc radius (the edge mixes in the dark field;
#: the parallax shift grows with k and must stay under half a lattice period for the phase slope)
INNER_FRACTION = 0.5
#: the strongest frequencies of the mean bright-field image whose phases give each pixel's shift
N_FREQUENCIES = 12
#: the largest scan window (positions per side) the parallax is measured on
WINDOW = 64
#: the parallax decides the twin when its sign is this many standard errors from 0
PARALLAX_SIGMAS = 3.0


@dataclass
class Parallax:
    """Shift (scan px [y, x]) of each inner bright-field pixel's image = ``matrix`` @ k (detector px
    [ky, kx] from the direct beam), with the standard error of each matrix entry."""

    matrix: np.ndarray
    error: np.ndarray

    def score(self, turn: np.ndarray) -> tuple[float, float]:
        """(s, its standard error): s = -<P, turn> > 0 when ``turn`` (detector -> scan 2x2) makes the
        bright-field images shift against k, as a probe focused above the specimen's middle does."""
        return -float(np.sum(self.matrix * turn)), float(np.sqrt(np.sum((turn * self.error) ** 2)))


def window(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): the central scan window of at most `WINDOW` positions per side."""
    sy, sx = shape[:2]
    hy, hx = min(sy, WINDOW), min(sx, WINDOW)
    return (sy - hy) // 2, (sy - hy) // 2 + hy, (sx - hx) // 2, (sx - hx) // 2 + hx


def inner_pixels(pattern_shape: tuple[int, int], radius_px: float) -> tuple[np.ndarray, np.ndarray]:
    """(mask, k): the bright-field pixels within INNER_FRACTION of ``radius_px`` of (ky // 2, kx // 2),
    and their k vectors (n, 2) in detector px."""
    ky, kx = pattern_shape
    yy, xx = np.mgrid[:ky, :kx]
    mask = np.hypot(yy - ky // 2, xx - kx // 2) <= max(INNER_FRACTION * radius_px, 1.0)
    return mask, np.stack([yy[mask] - ky // 2, xx[mask] - kx // 2], -1).astype(np.float64)


def bf_parallax(images: np.ndarray, k: np.ndarray) -> Parallax | None:
    """The parallax of (h, w, n) bright-field pixel images, pixel i at ``k[i]`` (detector px from the
    direct beam), each pattern already centred on its direct beam. Each image's shift against their
    mean is the phase slope at the mean's strongest frequencies; then one least-squares matrix over all pixels. None when nothing can be measured
    (too few positions or pixels, or a featureless mean image)."""
    h, w, n = images.shape
    if h < 4 or w < 4 or n < 5:
        return None
    # no taper: on periodic crystals a Hann window smeared the lattice peaks and turned 2 of 48 twins
    centred = images - images.mean(axis=(0, 1))
    ref = centred.mean(axis=2)
    spectrum = np.fft.fft2(ref)
    if not np.abs(spectrum).max() > 0:
        return None
    q = np.stack(np.meshgrid(np.fft.fftfreq(h), np.fft.fftfreq(w), indexing="ij"), -1).reshape(-1, 2)
    order = np.argsort(-np.abs(spectrum).ravel())[:N_FREQUENCIES]
    order = order[np.abs(q[order]).sum(axis=1) > 0]      # the mean (q = 0) carries no shift
    each = np.fft.fft2(centred, axes=(0, 1)).reshape(h * w, n)[order]
    phase = np.angle(each * np.conj(spectrum.ravel()[order])[:, None])   # -2 pi q . s per pixel
    weight = np.abs(spectrum.ravel()[order])[:, None]
    shifts, *_ = np.linalg.lstsq(q[order] * weight, -phase * weight / (2 * math.pi), rcond=None)   # (2, n)
    return _fit_matrix(shifts.T, k)


def _fit_matrix(shifts: np.ndarray, k: np.ndarray) -> Parallax | None:
    """Least squares shifts (n, 2) = k (n, 2) @ P.T, with each entry's standard error."""
    gram = k.T @ k
    if abs(np.linalg.det(gram)) < 1e-9:
        return None
    coef, *_ = np.linalg.lstsq(k, shifts, rcond=None)          # (2 k-components, 2 shift components)
    resid = shifts - k @ coef
    sigma2 = (resid ** 2).sum(axis=0) / max(len(k) - 2, 1)       # per shift component
    var = np.outer(sigma2, np.diag(np.linalg.inv(gram)))        # [shift component, k component]
    return Parallax(matrix=coef.T, error=np.sqrt(var))


def com_score(com: np.ndarray, dark: np.ndarray, turn: np.ndarray) -> float:
    """Sum of the integrated CoM (the (scan_y, scan_x, 2) field turned by ``turn`` into the scan frame,
    integrated in Fourier space) times the dark-field image: > 0 when the field points up the dark-field
    signal, towards the atoms, as a thin specimen's does."""
    field = (com - com.mean(axis=(0, 1))) @ turn.T
    sy, sx = field.shape[:2]
    qy, qx = np.fft.fftfreq(sy)[:, None], np.fft.fftfreq(sx)[None, :]
    q2 = qy ** 2 + qx ** 2
    q2[0, 0] = 1.0
    hat = (qy * np.fft.fft2(field[..., 0]) + qx * np.fft.fft2(field[..., 1])) / (2j * math.pi * q2)
    hat[0, 0] = 0.0
    return float(np.sum(np.fft.ifft2(hat).real * (dark - dark.mean())))


def read_bf_images(data: Any, centre_at: Any, radius_px: float) -> tuple[np.ndarray, np.ndarray]:
    """(h, w, n) images of the inner bright-field pixels over the central `window` of ``data``, each
    pattern moved by whole pixels so that its direct beam (``centre_at(ys, xs)`` -> (..., 2) px, the
    descan plane) sits at (ky // 2, kx // 2); and their k (n, 2). Read one scan row of the window at
    a time (a 4096 px detector's row of 64 patterns is 8 GB as float64: the row is kept in its dtype)."""
    y0, y1, x0, x1 = window(data.shape)
    ky, kx = data.shape[2:]
    mask, k = inner_pixels((ky, kx), radius_px)
    xs = np.arange(x0, x1, dtype=np.float64)
    out = np.empty((y1 - y0, x1 - x0, int(mask.sum())))
    for i, y in enumerate(range(y0, y1)):
        row = np.asarray(data[y, x0:x1])
        shifts = np.rint(centre_at(np.full_like(xs, y), xs) - np.array([ky // 2, kx // 2])).astype(int)
        for j in range(x1 - x0):
            out[i, j] = np.roll(row[j], (-shifts[j, 0], -shifts[j, 1]), axis=(0, 1))[mask]
    return out, k
