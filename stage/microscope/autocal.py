"""Calibration from the data, as py4DSTEM and pyxem do it, in bounded memory.

Everything here reads a scan ``data`` (scan_y, scan_x, ky, kx) by slicing only: a strided
subsample of patterns (`subsample`) for the mean pattern and its bright-field disc, and scan
blocks of bounded size (`scan_blocks`) for per-pattern scalars (total counts, bright-field disc
centre, centre of mass). ``data`` may be a numpy array, an h5py dataset, a dask array or a memmap;
the whole of it is never loaded.

Fitted from the data, each with an uncertainty:

- the direct-beam centre of every pattern (centroid of its thresholded bright-field disc, px);
- the descan: a least-squares plane of that centre against the scan position, each pattern weighted
  by its bright-field counts (a pattern without a count, which has no centre, left out), with its
  residual; `recentred_mean` is the mean pattern with that descan undone;
- the rotation (degrees) and flip of the patterns against the scan: the one that makes the
  centre-of-mass field curl-free (py4DSTEM's criterion), its 180-degree twin told apart by the
  bright-field parallax, else by the integrated CoM against the dark field (stage.microscope.twin:
  channelling reverses the CoM contrast of thick crystals, the parallax's sign it does not);
- the convergence semi-angle (mrad) from the disc radius, when the detector sampling is known.

`DataCalibration.recentre(block, y0, x0)` applies the descan plane and the rotation/flip to a
block ``data[y0:y0+h, x0:x0+w]`` so every pattern has its direct beam at index k // 2, the
convention the model was trained on. The disc itself is stage.microscope.disc (`find_disc`,
`Disc`). Axis order everywhere: (scan_y, scan_x, ky, kx).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np
from scipy import ndimage

from namsa.constants import mrad_per_inv_A

from . import twin
from .disc import Disc
from .disc import window as _window
from .rotation import Rotation, _in_maps_frame, fit_rotation

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


#: a direct beam this far (detector px) off the centre at a scan corner is recentred before inference
RECENTRE_TOL_PX = 0.25
#: ... when that is also this many standard errors of the fitted centre (low dose: a noisy fit)
RECENTRE_SIGMAS = 3.0
#: a fitted rotation is undone only when its standard error is at most this (degrees)
ROTATION_MAX_ERROR_DEG = 3.0
#: ... and it turns the detector's outermost pixel by more than RECENTRE_TOL_PX and ROTATION_SIGMAS errors
ROTATION_SIGMAS = 3.0


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
    step_y, step_x = _subsample_steps(data.shape, n)
    block = np.asarray(data[::step_y, ::step_x], dtype=np.float64)
    return block.reshape(-1, *block.shape[2:])


def _subsample_steps(shape: tuple[int, ...], n: int) -> tuple[int, int]:
    """The (y, x) strides of `subsample`: rows x columns <= n (and within SUBSAMPLE_BYTES)."""
    sy, sx, ky, kx = shape
    n = max(1, min(n, SUBSAMPLE_BYTES // (ky * kx * 8)))
    stride = max(1, math.ceil(math.sqrt(sy * sx / n)))
    step_x = max(stride, math.ceil(sx / n))  # at most n columns ...
    step_y = max(stride, math.ceil(sy / max(1, n // math.ceil(sx / step_x))))  # ... and rows x columns <= n
    return step_y, step_x


def recentred_mean(data: Any, descan: "DescanPlane", n: int = SUBSAMPLE_PATTERNS) -> np.ndarray:
    """The mean of `subsample`'s patterns, each first shifted by whole pixels so that its fitted
    direct beam (``descan``) sits where the first pattern's does: a descan smears the plain mean's
    disc edge over its whole range, this mean keeps it as sharp as one pattern's."""
    step_y, step_x = _subsample_steps(data.shape, n)
    block = np.asarray(data[::step_y, ::step_x], dtype=np.float64)
    ys, xs = np.meshgrid(np.arange(0, data.shape[0], step_y), np.arange(0, data.shape[1], step_x), indexing="ij")
    shifts = np.rint(descan.at(ys, xs) - descan.at(np.zeros(1), np.zeros(1))[0]).astype(int)
    total = np.zeros(block.shape[2:])
    for i in range(block.shape[0]):
        for j in range(block.shape[1]):
            total += np.roll(block[i, j], (-shifts[i, j, 0], -shifts[i, j, 1]), axis=(0, 1))
    return total / (block.shape[0] * block.shape[1])


def scan_blocks(shape: tuple[int, ...], block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, int, int, int]]:
    """(y0, y1, x0, x1) scan blocks covering ``shape`` row-major, each at most ``block_bytes`` of float64."""
    sy, sx, ky, kx = shape
    per_pattern = ky * kx * 8
    cols = max(1, min(sx, block_bytes // per_pattern))
    rows = max(1, block_bytes // (per_pattern * cols)) if cols == sx else 1
    for y0 in range(0, sy, rows):
        for x0 in range(0, sx, cols):
            yield y0, min(sy, y0 + rows), x0, min(sx, x0 + cols)


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

    def error_at(self, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        """Standard errors (..., 2) px of the fitted centres at scan indices ``ys``, ``xs`` (the
        coefficients' errors added in quadrature: their correlations are left out, which errs large)."""
        e = self.errors
        return np.stack([np.sqrt(e["origin"][k] ** 2 + (e["slope_y"][k] * ys) ** 2 + (e["slope_x"][k] * xs) ** 2)
                         for k in (0, 1)], -1)


def fit_descan(centre: np.ndarray, weights: np.ndarray | None = None) -> DescanPlane:
    """Least-squares plane of the (scan_y, scan_x, 2) direct-beam centres against scan position,
    each pattern weighted by ``weights`` (scan_y, scan_x): its bright-field counts, so that a pattern
    of few electrons counts little and one of none (whose centre is undefined) not at all."""
    sy, sx = centre.shape[:2]
    ys, xs = np.mgrid[:sy, :sx].astype(np.float64)
    design = np.stack([np.ones(sy * sx), ys.ravel(), xs.ravel()], -1)
    w = np.ones(sy * sx) if weights is None else np.clip(np.asarray(weights, np.float64).ravel(), 0.0, None)
    used = w > 0
    if used.sum() < 3:  # no pattern holds the beam: nothing to fit, and nothing to correct (see descan_correction)
        return _no_descan(sy, sx, centre.reshape(-1, 2).mean(axis=0))
    root = np.sqrt(w[used] / w[used].mean())[:, None]
    coef, *_ = np.linalg.lstsq(design[used] * root, centre.reshape(-1, 2)[used] * root, rcond=None)
    resid = (centre.reshape(-1, 2)[used] - design[used] @ coef) * root
    dof = max(int(used.sum()) - 3, 1)
    sigma2 = (resid ** 2).sum(axis=0) / dof
    cov_diag = np.diag(np.linalg.pinv((design[used] * root).T @ (design[used] * root)))
    err = np.sqrt(np.outer(cov_diag, sigma2))  # (3 coefficients, 2 components)
    return DescanPlane(origin=_pair(coef[0]), slope_y=_pair(coef[1]), slope_x=_pair(coef[2]),
                       errors={"origin": _pair(err[0]), "slope_y": _pair(err[1]), "slope_x": _pair(err[2])},
                       residual_rms_px=float(np.sqrt((resid ** 2).sum(axis=1).mean())))


def _no_descan(sy: int, sx: int, centre: np.ndarray) -> DescanPlane:
    """A flat plane at ``centre`` with unbounded errors: what a scan without counts says."""
    inf = (math.inf, math.inf)
    return DescanPlane(origin=_pair(centre), slope_y=(0.0, 0.0), slope_x=(0.0, 0.0),
                       errors={"origin": inf, "slope_y": inf, "slope_x": inf}, residual_rms_px=math.inf)


def _pair(row: np.ndarray) -> tuple[float, float]:
    return float(row[0]), float(row[1])


@dataclass
class DataCalibration:
    """What the data say about themselves (see the module docstring); ``recentre`` applies it."""

    pattern_shape: tuple[int, int]
    disc: Disc
    descan: DescanPlane
    rotation: Rotation
    semiangle_mrad: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)
    counts: Any = None  # stage.microscope.counts_restore.CountsRestore: camera values -> electrons, or None

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

    def descan_correction(self, scan_shape: tuple[int, int], flipped_yx: tuple[bool, bool] = (False, False)
                          ) -> Callable[[np.ndarray, int, int], np.ndarray] | None:
        """The pattern transform the reconstruction applies before inference, or None (the patterns go
        to the model untouched: no interpolation blur). `recentre` with the descan plane when the direct
        beam sits more than RECENTRE_TOL_PX (and RECENTRE_SIGMAS standard errors of the fit) off the
        detector centre at a corner of the scan, and with the rotation `applied_rotation` undoes (else
        none). ``flipped_yx``: the scan axes the reader will read backwards (a negative scan step); the
        fit saw the file's own order, so the maps' frame is that order mirrored along those axes."""
        turn = self.applied_rotation(flipped_yx)
        shifted = self._descan_measured(scan_shape)
        if turn is None and not shifted:
            return None
        r = turn or Rotation(0.0, False, self.rotation.curl_fraction, self.rotation.error_deg)
        plane = self.descan if shifted else _no_descan(1, 1, np.array(self.pattern_shape, float) // 2)
        return replace(self, rotation=r, descan=plane).recentre

    def _descan_measured(self, scan_shape: tuple[int, int]) -> bool:
        """Whether the direct beam sits off the detector centre at a scan corner by more than the
        tolerance and the fit's own noise (few counts per pattern: a shift that is not measured)."""
        ky, kx = self.pattern_shape
        ys = np.array([0.0, 0.0, scan_shape[0] - 1.0, scan_shape[0] - 1.0])
        xs = np.array([0.0, scan_shape[1] - 1.0, 0.0, scan_shape[1] - 1.0])
        off = np.abs(self.descan.at(ys, xs) - np.array([ky // 2, kx // 2], dtype=np.float64))
        return bool(np.any((off > RECENTRE_TOL_PX) & (off > RECENTRE_SIGMAS * self.descan.error_at(ys, xs))))

    def applied_rotation(self, flipped_yx: tuple[bool, bool] = (False, False)) -> Rotation | None:
        """The turn `descan_correction` undoes, in the maps' frame (the fit composed with the scan axes
        read backwards), or None: when it is the identity within the larger of ROTATION_SIGMAS errors
        and the angle that moves the detector's outermost pixel by RECENTRE_TOL_PX, or when the fit is
        not to be trusted (`rotation_trusted`)."""
        turn = _in_maps_frame(self.rotation, flipped_yx)
        if not turn.flip and self._near_half_turns(turn) is not None:
            return None
        return turn if self.rotation_trusted() else None

    def _near_half_turns(self, turn: Rotation) -> int | None:
        """0 or 180 when ``turn`` is that angle within the larger of ROTATION_SIGMAS errors and the angle
        that moves the detector's outermost pixel by RECENTRE_TOL_PX, else None. A half turn is never
        undone: no twin rule is right on every specimen and focus (stage.microscope.twin), and a file
        recorded as it stands is the common case, while a wrong half turn ruins every map (a scintillator
        scan of GaAs [011] read its wrong twin at 3.5 parallax standard errors)."""
        least = max(math.degrees(RECENTRE_TOL_PX / (min(self.pattern_shape) / 2.0)),
                    ROTATION_SIGMAS * self.rotation.error_deg)
        for whole in (0, 180):
            if abs((turn.angle_deg - whole + 180.0) % 360.0 - 180.0) <= least:
                return whole
        return None

    def rotation_trusted(self) -> bool:
        """A rotation fitted within ROTATION_MAX_ERROR_DEG whose twin the bright-field parallax decided at
        twin.PARALLAX_SIGMAS or more (the CoM's twin reverses in thick crystals: it is reported, not undone)."""
        r = self.rotation
        return r.error_deg <= ROTATION_MAX_ERROR_DEG and r.twin == "parallax" and r.twin_sigma >= twin.PARALLAX_SIGMAS

    def rotation_finding(self, flipped_yx: tuple[bool, bool] = (False, False)) -> tuple[str, str] | None:
        """(code, one-line message) for the checks report (check_report.add_warning) when the fitted rotation
        is undone or is too uncertain to undo; None when there is nothing to undo."""
        r = self.rotation
        what = (f"the patterns are turned {r.angle_deg:.1f} +- {r.error_deg:.1f} degrees"
                f"{' and mirrored (ky <-> kx)' if r.flip else ''} against the scan (fitted from the data, 180-degree "
                f"twin by {r.twin}{f' at {r.twin_sigma:.1f} sigma' if r.twin == 'parallax' else ''})")
        if self.applied_rotation(flipped_yx) is not None:
            return "scan-rotation", f"{what}: undone before inference"
        whole = None if r.flip else self._near_half_turns(_in_maps_frame(r, flipped_yx))
        if whole == 180:
            return "scan-rotation", (f"{what}: a half turn, which is not undone (no rule tells it from none on "
                                     "every specimen and focus); if the patterns really are turned 180 degrees "
                                     "against the scan, turn them (the Python API's pattern_transform) and rerun")
        if whole == 0 or self.rotation_trusted() or r.error_deg >= 180.0:
            return None   # as recorded (nothing to undo), or nothing fitted (a flat field)
        return "scan-rotation", (f"{what}: too uncertain to undo (an error over {ROTATION_MAX_ERROR_DEG:g} degrees or a twin under "
                                 f"{twin.PARALLAX_SIGMAS:g} sigma), the "
                                 "patterns go to the model as recorded; namsa reconstruct has no rotation flag: "
                                 "rotate the patterns yourself (the Python API's pattern_transform) if you know it")

    def report(self) -> dict[str, Any]:
        """The JSON record: every value with its unit and uncertainty."""
        d, r, p = self.disc, self.rotation, self.descan
        out: dict[str, Any] = {
            "disc_centre_px": {"value": list(d.centre_px), "unit": "px [ky, kx]", "uncertainty": d.radius_err_px},
            "disc_radius_px": {"value": d.radius_px, "unit": "px", "uncertainty": d.radius_err_px},
            "descan_origin_px": {"value": list(p.origin), "unit": "px [ky, kx] at scan (0, 0)",
                                 "uncertainty": _known(p.errors["origin"])},
            "descan_slope_y_px": {"value": list(p.slope_y), "unit": "px per scan row [ky, kx]",
                                  "uncertainty": _known(p.errors["slope_y"])},
            "descan_slope_x_px": {"value": list(p.slope_x), "unit": "px per scan column [ky, kx]",
                                  "uncertainty": _known(p.errors["slope_x"])},
            "descan_residual_rms_px": {"value": _known([p.residual_rms_px])[0], "unit": "px"},
            "rotation_deg": {"value": r.angle_deg, "unit": "degrees", "uncertainty": r.error_deg},
            "flip": {"value": r.flip, "unit": "ky <-> kx swapped before the rotation"},
            "curl_fraction": {"value": r.curl_fraction, "unit": "remaining / largest curl energy"},
            "rotation_twin": {"value": r.twin, "unit": "what chose angle or angle + 180",
                              "sigma": r.twin_sigma},
            "notes": list(self.notes)}
        if self.semiangle_mrad:
            out["semiangle_mrad"] = {"value": self.semiangle_mrad[0], "unit": "mrad",
                                     "uncertainty": self.semiangle_mrad[1]}
        return out


def _known(values: Any) -> list[float | None]:
    """Numbers for JSON: an unbounded error (no counts to fit) is null, not Infinity."""
    return [float(v) if math.isfinite(v) else None for v in values]


def semiangle_from_disc(disc: Disc, dk_inv_A: float, energy_kv: float) -> tuple[float, float]:
    """(semi-angle, its error) in mrad from the disc radius: radius_px * dk_inv_A * wavelength * 1000."""
    dk_mrad = dk_inv_A * mrad_per_inv_A(energy_kv)
    return disc.radius_px * dk_mrad, disc.radius_err_px * dk_mrad


def calibrate(data: Any, disc: Disc, scalars: ScanScalars) -> DataCalibration:
    """Descan plane and rotation/flip of a scan from its per-pattern scalars."""
    descan = fit_descan(scalars.centre, weights=scalars.total - scalars.dark)  # the bright-field counts
    sy, sx = scalars.total.shape
    ys, xs = np.mgrid[:sy, :sx].astype(np.float64)
    # a pattern without counts has no centre of mass: it counts as undeflected, not as one at pixel (0, 0)
    com = np.where((scalars.total > 0)[..., None], scalars.com - descan.at(ys, xs), 0.0)
    notes = []
    if sy < 3 or sx < 3:
        rotation = Rotation(0.0, False, 1.0, 180.0)
        notes.append("scan smaller than 3 x 3: rotation not fitted (taken as 0)")
    else:
        images, k = twin.read_bf_images(data, descan.at, disc.radius_px)
        rotation = fit_rotation(com, scalars.dark, twin.bf_parallax(images, k))
    return DataCalibration(pattern_shape=tuple(data.shape[2:]), disc=disc, descan=descan, rotation=rotation,
                           notes=notes)
