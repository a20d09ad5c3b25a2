"""Calibration from the data, as py4DSTEM and pyxem do it, in bounded memory.

Everything here reads a scan ``data`` (scan_y, scan_x, ky, kx) by slicing only: a strided
subsample of patterns (`subsample`) for the mean pattern and its bright-field disc, and scan
blocks of bounded size (`scan_blocks`) for per-pattern scalars (total counts, bright-field disc
centre, centre of mass). ``data`` may be a numpy array, an h5py dataset, a dask array or a memmap;
the whole of it is never loaded.

Fitted from the data, each with an uncertainty:

- the direct-beam centre of every pattern (centroid of its thresholded bright-field disc, px);
- the descan: a least-squares plane of that centre against the scan position, with its residual;
- the rotation (degrees) and flip of the patterns against the scan: the one that makes the
  centre-of-mass field curl-free (py4DSTEM's criterion), its 180-degree twin told apart by the
  sign of its divergence against the dark-field signal (atoms attract the beam: the CoM field
  converges where the annular dark field is bright);
- the convergence semi-angle (mrad) from the disc radius, when the detector sampling is known.

`DataCalibration.recentre(block, y0, x0)` applies the descan plane and the rotation/flip to a
block ``data[y0:y0+h, x0:x0+w]`` so every pattern has its direct beam at index k // 2, the
convention the model was trained on. Axis order everywhere: (scan_y, scan_x, ky, kx).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np
from scipy import ndimage

from namsa.constants import wavelength_A

#: patterns read (strided over the scan) for the mean pattern: enough to average out the specimen
SUBSAMPLE_PATTERNS = 256
#: at most this many bytes of float64 patterns are read for the mean pattern (a 4096 x 4096 detector:
#: one pattern, not 256 of them, 34 GB)
SUBSAMPLE_BYTES = 64 * 2**20
#: bytes of float64 patterns one scan block may hold while per-pattern scalars are accumulated
BLOCK_BYTES = 128 * 2**20
#: float64 block-sized temporaries `scan_scalars` holds at once (the block, its window, mask, percentile
#: sort, weighted sums); a 1 GB block peaked at 5.3 GB RSS
BLOCK_TEMPORARIES = 10
#: the smallest block worth reading (bytes), whatever the budget
MIN_BLOCK_BYTES = 2**20


def block_bytes_within(budget_bytes: int) -> int:
    """Bytes of one scan block such that `scan_scalars` stays within ``budget_bytes`` of memory."""
    return max(MIN_BLOCK_BYTES, budget_bytes // BLOCK_TEMPORARIES)
#: disc thresholds, as fractions between the background and the disc's level (py4DSTEM's
#: get_probe_size averages the radius over a band of thresholds the same way)
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
#: a bright-field disc smaller than this (px) is a spot: parallel illumination, not CBED
MIN_DISC_RADIUS_PX = 1.5
#: second-moment aspect (minor / major axis) a disc must reach to count as round
MIN_ROUNDNESS = 0.7
#: a second bright region with more than this fraction of the disc's intensity: not one disc
MAX_SECOND_SPOT = 0.25


#: a direct beam this far (detector px) off the centre at a scan corner is recentred before inference
RECENTRE_TOL_PX = 0.25

@dataclass
class Disc:
    """The bright-field disc of a mean pattern: centre (ky, kx) px, radius px with its spread
    over thresholds, roundness (minor / major axis), and the share of the second bright region."""

    centre_px: tuple[float, float]
    radius_px: float
    radius_err_px: float
    roundness: float
    second_spot: float
    background: float
    level: float


@dataclass
class ScanScalars:
    """Per-pattern scalars of a whole scan, (scan_y, scan_x) each: total intensity, bright-field
    disc centre (ky, kx) px, centre of mass (ky, kx) px, dark-field intensity (outside the disc);
    and the scan's largest value with the number of pixels that hold it."""

    total: np.ndarray
    centre: np.ndarray
    com: np.ndarray
    dark: np.ndarray
    max_value: float
    n_at_max: int
    n_pixels: int


def subsample(data: Any, n: int = SUBSAMPLE_PATTERNS) -> np.ndarray:
    """At most ``n`` patterns on a regular stride over the scan, float64 (m, ky, kx), read by slicing;
    fewer when ``n`` of them would exceed `SUBSAMPLE_BYTES` (a large detector: memory stays bounded)."""
    sy, sx, ky, kx = data.shape
    n = max(1, min(n, SUBSAMPLE_BYTES // (ky * kx * 8)))
    stride = max(1, math.ceil(math.sqrt(sy * sx / n)))
    step_x = max(stride, math.ceil(sx / n))  # at most n columns ...
    step_y = max(stride, math.ceil(sy / max(1, n // math.ceil(sx / step_x))))  # ... and rows x columns <= n
    block = np.asarray(data[::step_y, ::step_x], dtype=np.float64)
    return block.reshape(-1, *block.shape[2:])


def scan_blocks(shape: tuple[int, ...], block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, int, int, int]]:
    """(y0, y1, x0, x1) scan blocks covering ``shape`` row-major, each at most ``block_bytes`` of float64."""
    sy, sx, ky, kx = shape
    per_pattern = ky * kx * 8
    cols = max(1, min(sx, block_bytes // per_pattern))
    rows = max(1, block_bytes // (per_pattern * cols)) if cols == sx else 1
    for y0 in range(0, sy, rows):
        for x0 in range(0, sx, cols):
            yield y0, min(sy, y0 + rows), x0, min(sx, x0 + cols)


def find_disc(mean_pattern: np.ndarray) -> Disc | None:
    """The bright-field disc of a (ky, kx) mean pattern, or None when nothing stands out of the
    background. The radius is sqrt(area / pi) of the thresholded region holding the brightest
    pixel, averaged over `THRESHOLDS`; its error is their spread (at least 0.3 px, the
    quantisation of a pixel edge)."""
    p = np.asarray(mean_pattern, dtype=np.float64)
    background = float(np.percentile(p, 20))
    peak = np.unravel_index(int(np.argmax(p)), p.shape)
    level = float(np.percentile(p[_window(p.shape, peak, 2.0)], 50))  # robust to one hot pixel
    if not level > background:
        return None
    radii, shapes = [], []
    for t in THRESHOLDS:
        labels, _ = ndimage.label(p > background + t * (level - background))
        region = labels == labels[peak] if labels[peak] else None
        if region is None:
            continue
        radii.append(math.sqrt(region.sum() / math.pi))
        shapes.append((region, labels))
    if not radii:
        return None
    region, labels = shapes[len(shapes) // 2]
    weights = np.clip(p - background, 0.0, None)
    disc_sum = float(weights[region].sum())
    others = [float(weights[labels == i].sum()) for i in range(1, labels.max() + 1) if not region[labels == i].any()]
    ys, xs = np.nonzero(region)
    cov = np.cov(np.stack([ys, xs])) if len(ys) > 2 else np.eye(2)
    eig = np.linalg.eigvalsh(cov)
    roundness = float(math.sqrt(max(eig[0], 0.0) / eig[1])) if eig[1] > 0 else 0.0
    return Disc(centre_px=(float(ys.mean()), float(xs.mean())), radius_px=float(np.mean(radii)),
                radius_err_px=max(float(np.std(radii)), 0.3), roundness=roundness,
                second_spot=max(others, default=0.0) / disc_sum if disc_sum > 0 else 1.0,
                background=background, level=level)


def _window(shape: tuple[int, ...], centre: tuple[float, ...], radius: float) -> np.ndarray:
    """Boolean (ky, kx) mask of the pixels within ``radius`` px of ``centre``."""
    yy, xx = np.ogrid[: shape[0], : shape[1]]
    return (yy - centre[0]) ** 2 + (xx - centre[1]) ** 2 <= radius ** 2


def scan_scalars(data: Any, disc: Disc, block_bytes: int = BLOCK_BYTES) -> ScanScalars:
    """Per-pattern scalars over the whole scan, read block by block (bounded memory)."""
    sy, sx, ky, kx = data.shape
    out = ScanScalars(total=np.zeros((sy, sx)), centre=np.zeros((sy, sx, 2)), com=np.zeros((sy, sx, 2)),
                      dark=np.zeros((sy, sx)), max_value=-np.inf, n_at_max=0, n_pixels=sy * sx * ky * kx)
    window = _window((ky, kx), disc.centre_px, disc.radius_px + 3.0)  # + 3 px: room for the descan
    yy, xx = np.mgrid[:ky, :kx].astype(np.float64)
    for y0, y1, x0, x1 in scan_blocks(data.shape, block_bytes):
        raw = np.asarray(data[y0:y1, x0:x1])
        _count_max(out, raw)
        block = raw.astype(np.float64)
        total = block.sum(axis=(2, 3))
        out.total[y0:y1, x0:x1] = total
        safe = np.where(total > 0, total, 1.0)
        out.com[y0:y1, x0:x1] = _centroid(block, yy, xx) / safe[..., None]
        inside = np.where(window, block, -np.inf)
        top = inside.max(axis=(2, 3), keepdims=True)
        bg = np.percentile(block, 20, axis=(2, 3), keepdims=True)
        mask = (inside > bg + 0.5 * (top - bg)).astype(np.float64)
        n = np.maximum(mask.sum(axis=(2, 3)), 1.0)
        out.centre[y0:y1, x0:x1] = _centroid(mask, yy, xx) / n[..., None]
        out.dark[y0:y1, x0:x1] = total - np.where(window, block, 0.0).sum(axis=(2, 3))
    return out


def _centroid(weights: np.ndarray, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """(..., 2) first moments [ky, kx] of (..., ky, kx) weights (not yet divided by their sum)."""
    return np.stack([(weights * yy).sum(axis=(-2, -1)), (weights * xx).sum(axis=(-2, -1))], -1)


def _count_max(out: ScanScalars, raw: np.ndarray) -> None:
    """Keep the scan's largest value and how many pixels hold it (a clipped detector piles them up)."""
    top = float(raw.max())
    if top > out.max_value:
        out.max_value, out.n_at_max = top, int(np.count_nonzero(raw == top))
    elif top == out.max_value:
        out.n_at_max += int(np.count_nonzero(raw == top))


@dataclass
class DescanPlane:
    """Direct-beam centre (ky, kx) px = origin + slope_y * scan_y + slope_x * scan_x (scan indices),
    with the standard errors of the coefficients and the residual RMS (px) of the fit."""

    origin: tuple[float, float]
    slope_y: tuple[float, float]
    slope_x: tuple[float, float]
    errors: dict[str, tuple[float, float]]
    residual_rms_px: float

    def at(self, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        """Fitted centres (..., 2) px at scan indices ``ys``, ``xs`` (broadcast together)."""
        return np.stack([self.origin[k] + self.slope_y[k] * ys + self.slope_x[k] * xs for k in (0, 1)], -1)


def fit_descan(centre: np.ndarray) -> DescanPlane:
    """Least-squares plane of the (scan_y, scan_x, 2) direct-beam centres against scan position."""
    sy, sx = centre.shape[:2]
    ys, xs = np.mgrid[:sy, :sx].astype(np.float64)
    design = np.stack([np.ones(sy * sx), ys.ravel(), xs.ravel()], -1)
    coef, *_ = np.linalg.lstsq(design, centre.reshape(-1, 2), rcond=None)
    resid = centre.reshape(-1, 2) - design @ coef
    dof = max(sy * sx - 3, 1)
    sigma2 = (resid ** 2).sum(axis=0) / dof
    cov_diag = np.diag(np.linalg.pinv(design.T @ design))
    err = np.sqrt(np.outer(cov_diag, sigma2))  # (3 coefficients, 2 components)
    return DescanPlane(origin=_pair(coef[0]), slope_y=_pair(coef[1]), slope_x=_pair(coef[2]),
                       errors={"origin": _pair(err[0]), "slope_y": _pair(err[1]), "slope_x": _pair(err[2])},
                       residual_rms_px=float(np.sqrt((resid ** 2).sum(axis=1).mean())))


def _pair(row: np.ndarray) -> tuple[float, float]:
    return float(row[0]), float(row[1])


@dataclass
class Rotation:
    """Rotation (degrees, counter-clockwise from ky to kx) and flip (ky <-> kx swapped first) that
    bring the patterns' centre-of-mass vectors into the scan frame; ``curl_fraction``: the
    remaining curl energy over the largest (0 = curl-free), ``error_deg``: standard error."""

    angle_deg: float
    flip: bool
    curl_fraction: float
    error_deg: float

    def matrix(self) -> np.ndarray:
        """2x2 map of a (ky, kx) vector in the detector frame to the scan frame."""
        c, s = math.cos(math.radians(self.angle_deg)), math.sin(math.radians(self.angle_deg))
        rot = np.array([[c, -s], [s, c]])
        return rot @ np.array([[0.0, 1.0], [1.0, 0.0]]) if self.flip else rot


def fit_rotation(com: np.ndarray, dark: np.ndarray) -> Rotation:
    """The rotation and flip that make the (scan_y, scan_x, 2) CoM field (descan removed)
    curl-free. The curl of the rotated field is cos(t) curl F + sin(t) div F, so the angle is the
    smallest eigenvector of their 2x2 energy matrix; the error is the spread over scan quadrants
    (180 degrees, angle 0, for a flat field: nothing to fit)."""
    if not np.any(np.abs(com - com.mean(axis=(0, 1))) > 1e-9):
        return Rotation(0.0, False, 1.0, 180.0)  # a flat CoM field (no specimen signal) says nothing
    best = min((_curl_free(com, flip) + (flip,) for flip in (False, True)), key=lambda r: r[1])
    angle, fraction, flip = best
    angle = _resolve_half_turn(com, dark, angle, flip)
    quads = [_curl_free(q, flip)[0] for q in _quadrants(com)]
    diffs = [((a - angle + 90.0) % 180.0) - 90.0 for a in quads]
    error = float(np.std(diffs) / math.sqrt(len(diffs))) if diffs else 180.0
    return Rotation(angle_deg=angle % 360.0, flip=flip, curl_fraction=fraction, error_deg=error)


def _curl_free(com: np.ndarray, flip: bool) -> tuple[float, float]:
    """(angle in [0, 180) degrees, remaining curl fraction) for one flip."""
    fy, fx = (com[..., 1], com[..., 0]) if flip else (com[..., 0], com[..., 1])
    curl = np.gradient(fx, axis=0) - np.gradient(fy, axis=1)
    div = np.gradient(fy, axis=0) + np.gradient(fx, axis=1)
    energy = np.array([[np.sum(curl * curl), np.sum(curl * div)], [np.sum(curl * div), np.sum(div * div)]])
    values, vectors = np.linalg.eigh(energy)
    c, s = vectors[:, 0]
    fraction = float(values[0] / values[1]) if values[1] > 0 else 1.0
    return math.degrees(math.atan2(s, c)) % 180.0, fraction


def _resolve_half_turn(com: np.ndarray, dark: np.ndarray, angle: float, flip: bool) -> float:
    """``angle`` or ``angle + 180``: the one whose CoM field converges (negative divergence) where
    the dark-field signal is high, as a field pulled towards the atoms does."""
    field = com @ Rotation(angle, flip, 0.0, 0.0).matrix().T
    div = np.gradient(field[..., 0], axis=0) + np.gradient(field[..., 1], axis=1)
    return angle if np.sum(div * (dark - dark.mean())) <= 0 else angle + 180.0


def _quadrants(a: np.ndarray) -> list[np.ndarray]:
    """The four quadrants of a scan-shaped array (each at least 3 x 3 positions, else none)."""
    hy, hx = a.shape[0] // 2, a.shape[1] // 2
    if hy < 3 or hx < 3:
        return []
    return [a[:hy, :hx], a[:hy, hx:], a[hy:, :hx], a[hy:, hx:]]


@dataclass
class DataCalibration:
    """What the data say about themselves (see the module docstring); ``recentre`` applies it."""

    pattern_shape: tuple[int, int]
    disc: Disc
    descan: DescanPlane
    rotation: Rotation
    semiangle_mrad: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)

    def recentre(self, block: np.ndarray, y0: int, x0: int) -> np.ndarray:
        """Block (h, w, ky, kx) float at scan offset (y0, x0) -> the same block with each pattern's
        direct beam (from the descan plane) moved to (ky // 2, kx // 2) and the fitted rotation and
        flip undone, by one linear interpolation per pattern (edges: nearest pixel)."""
        block = np.asarray(block, dtype=np.float64)
        h, w, ky, kx = block.shape
        ys, xs = np.mgrid[y0: y0 + h, x0: x0 + w].astype(np.float64)
        centres = self.descan.at(ys, xs)
        inverse = np.linalg.inv(self.rotation.matrix())
        target = np.array([ky // 2, kx // 2], dtype=np.float64)
        out = np.empty_like(block)
        for i in range(h):
            for j in range(w):
                offset = centres[i, j] - inverse @ target
                out[i, j] = ndimage.affine_transform(block[i, j], inverse, offset=offset, order=1, mode="nearest")
        return out

    def descan_correction(self, scan_shape: tuple[int, int]) -> Callable[[np.ndarray, int, int], np.ndarray] | None:
        """The pattern transform the reconstruction applies before inference: `recentre` with the
        rotation left out when the direct beam sits more than RECENTRE_TOL_PX off the detector
        centre at a corner of the scan (descan, or a mis-centred detector); None otherwise, so the
        patterns go to the model untouched (no interpolation blur). A fitted rotation or flip is
        reported, never applied here: a flip the file's metadata states (a negative scan scale) is
        already undone by reading that axis backwards, and the fit sees the file's own order."""
        ky, kx = self.pattern_shape
        ys = np.array([0.0, 0.0, scan_shape[0] - 1.0, scan_shape[0] - 1.0])
        xs = np.array([0.0, scan_shape[1] - 1.0, 0.0, scan_shape[1] - 1.0])
        off = np.abs(self.descan.at(ys, xs) - np.array([ky // 2, kx // 2], dtype=np.float64))
        if off.max() <= RECENTRE_TOL_PX:
            return None
        r = self.rotation
        return replace(self, rotation=Rotation(0.0, False, r.curl_fraction, r.error_deg)).recentre

    def report(self) -> dict[str, Any]:
        """The JSON record: every value with its unit and uncertainty."""
        d, r, p = self.disc, self.rotation, self.descan
        out: dict[str, Any] = {
            "disc_centre_px": {"value": list(d.centre_px), "unit": "px [ky, kx]", "uncertainty": d.radius_err_px},
            "disc_radius_px": {"value": d.radius_px, "unit": "px", "uncertainty": d.radius_err_px},
            "descan_origin_px": {"value": list(p.origin), "unit": "px [ky, kx] at scan (0, 0)",
                                 "uncertainty": list(p.errors["origin"])},
            "descan_slope_y_px": {"value": list(p.slope_y), "unit": "px per scan row [ky, kx]",
                                  "uncertainty": list(p.errors["slope_y"])},
            "descan_slope_x_px": {"value": list(p.slope_x), "unit": "px per scan column [ky, kx]",
                                  "uncertainty": list(p.errors["slope_x"])},
            "descan_residual_rms_px": {"value": p.residual_rms_px, "unit": "px"},
            "rotation_deg": {"value": r.angle_deg, "unit": "degrees", "uncertainty": r.error_deg},
            "flip": {"value": r.flip, "unit": "ky <-> kx swapped before the rotation"},
            "curl_fraction": {"value": r.curl_fraction, "unit": "remaining / largest curl energy"},
            "notes": list(self.notes)}
        if self.semiangle_mrad:
            out["semiangle_mrad"] = {"value": self.semiangle_mrad[0], "unit": "mrad",
                                     "uncertainty": self.semiangle_mrad[1]}
        return out


def semiangle_from_disc(disc: Disc, dk_inv_A: float, energy_kv: float) -> tuple[float, float]:
    """(semi-angle, its error) in mrad from the disc radius: radius_px * dk_inv_A * wavelength * 1000."""
    dk_mrad = dk_inv_A * wavelength_A(energy_kv) * 1e3
    return disc.radius_px * dk_mrad, disc.radius_err_px * dk_mrad


def calibrate(data: Any, disc: Disc, scalars: ScanScalars) -> DataCalibration:
    """Descan plane and rotation/flip of a scan from its per-pattern scalars."""
    descan = fit_descan(scalars.centre)
    sy, sx = scalars.total.shape
    ys, xs = np.mgrid[:sy, :sx].astype(np.float64)
    com = scalars.com - descan.at(ys, xs)
    notes = []
    if sy < 3 or sx < 3:
        rotation = Rotation(0.0, False, 1.0, 180.0)
        notes.append("scan smaller than 3 x 3: rotation not fitted (taken as 0)")
    else:
        rotation = fit_rotation(com, scalars.dark)
    return DataCalibration(pattern_shape=tuple(data.shape[2:]), disc=disc, descan=descan, rotation=rotation,
                           notes=notes)
