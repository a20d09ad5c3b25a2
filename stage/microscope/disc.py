"""The bright-field disc of a mean pattern, and whether it is one (convergent-beam data) at all.

`find_disc` measures the disc of a (ky, kx) mean pattern by thresholds between its background and
its level, as py4DSTEM's get_probe_size does; `not_cbed` says, in words, why a pattern is not CBED
or None. A convergent beam gives a bright-field disc of the convergence semi-angle with a sharp
edge: on namsa simulations up to 150 Angstrom thick (GaAs, SrTiO3, Cu; 10 and 20 mrad) and after a
one-pixel Gaussian detector blur, the radius changes by at most 0.54 of itself between the 30% and
70% thresholds. A parallel or precessed beam focuses to a spot: its direct beam, however bright
or saturated, fades into a halo over many pixels (NanoMegas' test1.blo: 8.6 px between the two
thresholds around a 7.7 px core, 1.1 of itself), and a spot smaller than `MIN_DISC_RADIUS_PX` is
no disc at all. Axis order: (ky, kx), pixels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

#: disc thresholds, as fractions between the background and the disc's level (py4DSTEM's
#: get_probe_size averages the radius over a band of thresholds the same way)
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
#: a bright-field disc smaller than this (px) is a spot: parallel illumination, not CBED
MIN_DISC_RADIUS_PX = 1.5
#: second-moment aspect (minor / major axis) a disc must reach to count as round
MIN_ROUNDNESS = 0.7
#: a second bright region with more than this fraction of the disc's intensity: not one disc
MAX_SECOND_SPOT = 0.25
#: the radius change between the outer and inner threshold, over the radius, above which the
#: direct beam has no edge (a spot with a halo); CBED reaches 0.54 at most (module docstring)
MAX_EDGE_FRACTION = 0.8
#: ... and at least this many pixels of change (a disc of 2 px is measured to ~1 px)
MIN_EDGE_PX = 2.0


@dataclass
class Disc:
    """The bright-field disc of a mean pattern: centre (ky, kx) px, radius px with its spread
    over thresholds, roundness (minor / major axis), the share of the second bright region, and
    the radii (px) at the outermost and innermost thresholds (its edge)."""

    centre_px: tuple[float, float]
    radius_px: float
    radius_err_px: float
    roundness: float
    second_spot: float
    background: float
    level: float
    outer_px: float = math.nan
    inner_px: float = math.nan

    @property
    def edge_px(self) -> float:
        """How far (px) the outermost threshold lies beyond the innermost: the edge's width."""
        return self.outer_px - self.inner_px


def window(shape: tuple[int, ...], centre: tuple[float, ...], radius: float) -> np.ndarray:
    """Boolean (ky, kx) mask of the pixels within ``radius`` px of ``centre``."""
    yy, xx = np.ogrid[: shape[0], : shape[1]]
    return (yy - centre[0]) ** 2 + (xx - centre[1]) ** 2 <= radius ** 2


def find_disc(mean_pattern: np.ndarray) -> Disc | None:
    """The bright-field disc of a (ky, kx) mean pattern, or None when nothing stands out of the
    background. The radius is sqrt(area / pi) of the thresholded region holding the brightest
    pixel, averaged over `THRESHOLDS`; its error is their spread (at least 0.3 px, the
    quantisation of a pixel edge)."""
    p = np.asarray(mean_pattern, dtype=np.float64)
    background = float(np.percentile(p, 20))
    peak = np.unravel_index(int(np.argmax(p)), p.shape)
    level = float(np.percentile(p[window(p.shape, peak, 2.0)], 50))  # robust to one hot pixel
    if not level > background:
        return None
    radii, shapes = [], []
    for t in THRESHOLDS:
        labels, _ = ndimage.label(p > background + t * (level - background))
        if not labels[peak]:
            continue
        region = labels == labels[peak]
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
                background=background, level=level, outer_px=radii[0], inner_px=radii[-1])


def not_cbed(disc: Disc | None) -> str | None:
    """Why a mean pattern with this disc is not convergent-beam data, in words; None when it is."""
    if disc is None:
        return "nothing stands out of the background"
    if disc.radius_px < MIN_DISC_RADIUS_PX:
        return f"the direct beam is a spot of radius {disc.radius_px:.2g} px, not a disc"
    if disc.roundness < MIN_ROUNDNESS:
        return f"the brightest region is not round (minor/major axis {disc.roundness:.2f})"
    if disc.second_spot > MAX_SECOND_SPOT:
        return f"a second bright region carries {100 * disc.second_spot:.0f}% of the direct beam's intensity"
    if disc.edge_px > max(MAX_EDGE_FRACTION * disc.radius_px, MIN_EDGE_PX):
        return (f"the direct beam has no edge: it fades from 70% of its level at a radius of {disc.inner_px:.1f} px "
                f"to 30% at {disc.outer_px:.1f} px, as a focused or precessed beam's spot does, where a bright-field "
                "disc ends within about a pixel")
    return None
