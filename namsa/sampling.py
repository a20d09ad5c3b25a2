"""The sampling a simulation config gives its samples: the grid pixel, the detector pixel of a pattern
and the scan step, for one supercell and as the range every supercell the config allows spans.

namsa's own code asks these functions: the pattern rebinner (`namsa.detector.pattern_rebinner`) takes
its detector pixel from `detector_pixel_inv_A`, the probe positions their step from
`namsa.optics.scan_step_A`, and the grid's rounding bound is `namsa.potential.grid_spacing_range_A`.
Every other room (a model card's ``expects_input``, the fit of a microscope scan to a model, the
memory estimate of a run) asks `config_sampling` instead of re-deriving the arithmetic.

Units: Angstrom for lengths, 1/Angstrom (or mrad, `ScanSampling.dk_mrad`) per detector pixel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .constants import mrad_per_inv_A
from .optics import band_limit_frequency, scan_step_A
from .potential import grid_spacing_range_A

if TYPE_CHECKING:
    from .config import SimulationConfig

#: the supercell is the smallest whole number of unit cells at least ``cell_lateral_A`` wide
#: (`namsa.supercell`), so it is narrower than this many times ``cell_lateral_A`` whenever one unit cell
#: is no wider than ``cell_lateral_A`` (every library material at the default 12 Angstrom)
SUPERCELL_MAX_FACTOR = 2.0
#: relative slack of an accepted range (`accepted`): a microscope's calibration is known to ~1-2%
ACCEPT_RTOL = 0.02
#: the fields of a `SimulationConfig` that decide what its samples look like to a detector and a
#: scan (physics and sampling; not the plan of materials or the execution): a model card's expects_input
SAMPLING_FIELDS: tuple[str, ...] = ("energy_kv", "semiangle_mrad", "sampling_A", "gpts", "scan_shape", "pattern_px",
                                    "target_px", "cell_lateral_A", "scan_fov_fraction", "scan_fov_A",
                                    "fft_friendly_grid", "band_limit", "thickness_A", "aberrations", "variations")


def detector_pixel_inv_A(grid_sampling_A: Sequence[float], band_limit: float, pattern_px: int) -> float:
    """Detector pixel (1/Angstrom) of a P x P pattern: the band-limited disc of a grid of pixel
    ``grid_sampling_A`` (dy, dx) spans the pattern, dk = 2 k_max / P."""
    return 2.0 * band_limit_frequency(tuple(grid_sampling_A), band_limit) / pattern_px  # type: ignore[arg-type]


def accepted(span: tuple[float, float], rtol: float = ACCEPT_RTOL) -> tuple[float, float]:
    """A (low, high) range widened by ``rtol`` on either side: what a calibrated input may deviate."""
    return span[0] * (1.0 - rtol), span[1] * (1.0 + rtol)


@dataclass(frozen=True)
class ScanSampling:
    """What every sample of a config looks like: its physics, sizes, and the span (low, high) of the
    grid pixel (Angstrom), detector pixel (1/Angstrom) and scan step (Angstrom, either axis) over every
    supercell the config allows."""

    energy_kv: float
    semiangle_mrad: float
    scan_shape: tuple[int, int]
    pattern_px: int
    target_px: int
    grid_px: tuple[int, int]
    grid_sampling_A: tuple[float, float]
    dk_inv_A: tuple[float, float]
    step_A: tuple[float, float]

    @property
    def dk_mrad(self) -> tuple[float, float]:
        """The detector pixel span in mrad at this beam energy."""
        mrad = mrad_per_inv_A(self.energy_kv)
        return self.dk_inv_A[0] * mrad, self.dk_inv_A[1] * mrad


def config_sampling(cfg: SimulationConfig) -> ScanSampling:
    """The `ScanSampling` of ``cfg``: the supercell spans [cell_lateral_A, SUPERCELL_MAX_FACTOR x
    cell_lateral_A); its grid is ``gpts`` pixels, else as fine as ``sampling_A`` rounded by
    `namsa.potential.make_grid`; the scan covers ``scan_fov_A`` or the ``scan_fov_fraction`` of it."""
    widths = (cfg.cell_lateral_A, SUPERCELL_MAX_FACTOR * cfg.cell_lateral_A)
    if cfg.gpts:
        spacing = (widths[0] / cfg.gpts, widths[1] / cfg.gpts)
        grid_px = (int(cfg.gpts), int(cfg.gpts))
    else:
        spacing = grid_spacing_range_A(float(cfg.sampling_A))  # type: ignore[arg-type]
        grid_px = (math.ceil(widths[0] / cfg.sampling_A - 1e-9), math.ceil(widths[1] / spacing[0]))
    dk = tuple(detector_pixel_inv_A((s, s), cfg.band_limit, cfg.pattern_px) for s in (spacing[1], spacing[0]))
    return ScanSampling(energy_kv=float(cfg.energy_kv), semiangle_mrad=float(cfg.semiangle_mrad),
                        scan_shape=(int(cfg.scan_shape[0]), int(cfg.scan_shape[1])), pattern_px=int(cfg.pattern_px),
                        target_px=int(cfg.target_px), grid_px=grid_px, grid_sampling_A=spacing,
                        dk_inv_A=dk, step_A=_step_span(cfg, widths))  # type: ignore[arg-type]


def _step_span(cfg: SimulationConfig, widths: tuple[float, float]) -> tuple[float, float]:
    """(smallest, largest) scan step of either axis over supercells ``widths`` wide (Angstrom)."""
    if cfg.scan_fov_A is not None:  # a fixed field of view: one step per axis, whatever the supercell
        steps = scan_step_A(cfg.scan_fov_A, cfg.scan_shape)
        return min(steps), max(steps)
    f = cfg.scan_fov_fraction
    low = scan_step_A((0.0, 0.0, f * widths[0], f * widths[0]), cfg.scan_shape)
    high = scan_step_A((0.0, 0.0, f * widths[1], f * widths[1]), cfg.scan_shape)
    return min(low), max(high)


def sampling_fields(cfg: SimulationConfig) -> dict[str, Any]:
    """``cfg``'s `SAMPLING_FIELDS` as JSON values: what a model trained on its samples expects of its
    input (a model card's ``expects_input``); `config_sampling` of them gives the same `ScanSampling`."""
    return cfg.model_dump(mode="json", include=set(SAMPLING_FIELDS))


__all__ = ["ScanSampling", "config_sampling", "detector_pixel_inv_A", "accepted", "sampling_fields",
           "SAMPLING_FIELDS", "SUPERCELL_MAX_FACTOR", "ACCEPT_RTOL"]
