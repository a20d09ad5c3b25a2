"""The rotation and flip of a scan's patterns against the scan, fitted from the centre-of-mass field
(stage.microscope.autocal calls it; the 180-degree twin is stage.microscope.twin's). Angles in
degrees, counter-clockwise from ky to kx; fields (scan_y, scan_x, 2) with vectors [ky, kx]."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from . import twin


@dataclass
class Rotation:
    """Rotation (degrees, counter-clockwise from ky to kx) and flip (ky <-> kx swapped first) that
    bring the patterns' centre-of-mass vectors into the scan frame; ``curl_fraction``: the
    remaining curl energy over the largest (0 = curl-free), ``error_deg``: standard error;
    ``twin``: what chose between angle and angle + 180 ("parallax", "centre of mass" or "none"),
    ``twin_sigma``: the parallax score in standard errors (0 when it did not decide)."""

    angle_deg: float
    flip: bool
    curl_fraction: float
    error_deg: float
    twin: str = "none"
    twin_sigma: float = 0.0

    def matrix(self) -> np.ndarray:
        """2x2 map of a (ky, kx) vector in the detector frame to the scan frame."""
        c, s = math.cos(math.radians(self.angle_deg)), math.sin(math.radians(self.angle_deg))
        rot = np.array([[c, -s], [s, c]])
        return rot @ np.array([[0.0, 1.0], [1.0, 0.0]]) if self.flip else rot


def fit_rotation(com: np.ndarray, dark: np.ndarray, parallax: twin.Parallax | None = None) -> Rotation:
    """The rotation and flip that make the (scan_y, scan_x, 2) CoM field (descan removed)
    curl-free. The curl of the rotated field is cos(t) curl F + sin(t) div F, so the angle is the
    smallest eigenvector of their 2x2 energy matrix; the error is the spread over scan quadrants
    (180 degrees, angle 0, for a flat field: nothing to fit). The 180-degree twin: `_resolve_half_turn`
    with the bright-field ``parallax`` (stage.microscope.twin)."""
    if not np.any(np.abs(com - com.mean(axis=(0, 1))) > 1e-9):
        return Rotation(0.0, False, 1.0, 180.0)  # a flat CoM field (no specimen signal) says nothing
    best = min((_curl_free(com, flip) + (flip,) for flip in (False, True)), key=lambda r: r[1])
    angle, fraction, flip = best
    quads = [_curl_free(q, flip)[0] for q in _quadrants(com)]
    diffs = [((a - angle + 90.0) % 180.0) - 90.0 for a in quads]
    # the quadrants' spread, not its standard error of the mean: one crystal's quadrants share its systematic
    # error (Cu2O [011] 60 Angstrom at 20 degrees read 21.4 with a standard error of the mean of 0.2)
    error = float(np.std(diffs)) if diffs else 180.0
    angle, how, sigma = _resolve_half_turn(com, dark, angle, flip, parallax)
    return Rotation(angle_deg=angle % 360.0, flip=flip, curl_fraction=fraction, error_deg=error, twin=how,
                    twin_sigma=sigma)


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


def _resolve_half_turn(com: np.ndarray, dark: np.ndarray, angle: float, flip: bool,
                       parallax: twin.Parallax | None = None) -> tuple[float, str, float]:
    """(``angle`` or ``angle + 180``, what decided, parallax standard errors): the bright-field
    parallax's sign whenever a parallax was measured (its significance is kept: `rotation_trusted`
    needs twin.PARALLAX_SIGMAS), else the twin whose integrated CoM is bright where the dark field is
    (stage.microscope.twin says why, and where each holds: falling back to the CoM whenever the
    parallax was under 3 sigma turned 2 of 48 twins at 150 Angstrom that the parallax's sign had right)."""
    turn = Rotation(angle, flip, 0.0, 0.0).matrix()
    if parallax is not None:
        score, error = parallax.score(turn)
        if score != 0:
            return (angle if score > 0 else angle + 180.0), "parallax", abs(score) / error if error > 0 else math.inf
    return (angle if twin.com_score(com, dark, turn) >= 0 else angle + 180.0), "centre of mass", 0.0


def _quadrants(a: np.ndarray) -> list[np.ndarray]:
    """The four quadrants of a scan-shaped array (each at least 3 x 3 positions, else none)."""
    hy, hx = a.shape[0] // 2, a.shape[1] // 2
    if hy < 3 or hx < 3:
        return []
    return [a[:hy, :hx], a[:hy, hx:], a[hy:, :hx], a[hy:, hx:]]



def _in_maps_frame(r: Rotation, flipped_yx: tuple[bool, bool]) -> Rotation:
    """``r`` followed by the mirror of the scan axes read backwards (diag(+-1, +-1)), as a Rotation."""
    m = np.diag([-1.0 if f else 1.0 for f in flipped_yx]) @ r.matrix()
    flip = bool(np.linalg.det(m) < 0)
    m = m @ np.array([[0.0, 1.0], [1.0, 0.0]]) if flip else m   # R P P = R: the rotation part
    return replace(r, angle_deg=math.degrees(math.atan2(m[1, 0], m[0, 0])) % 360.0, flip=flip)
