"""Per-sample variation draws: the sample's seed, its thickness, its frozen-phonon configurations,
and its beam tilt and defocus (``cfg.variations``)."""
from __future__ import annotations

import hashlib
import math
from typing import Any, Sequence

import numpy as np

from .config import SimulationConfig
from .random_streams import SampleStream, sample_rng


def sample_seed(cfg: SimulationConfig, material_id: str, zone_axis: Sequence[int], variant: int) -> int:
    text = f"{cfg.seed}|{material_id}|{'_'.join(str(int(i)) for i in zone_axis)}|{int(variant)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def specimen_thickness_A(cfg: SimulationConfig, seed: int) -> float:
    """The requested specimen thickness (Angstrom): ``thickness_A``, or a uniform draw from
    ``variations.thickness_range_A`` on a stream of its own (namsa.random_streams); with
    ``thin_fraction`` that draw is from [lo, thin_below_A) for the thin share of the samples (decided
    on a further stream of its own) and from [thin_below_A, hi] for the others."""
    var = cfg.variations
    if var.thickness_range_A is None:
        return cfg.thickness_A
    lo, hi = var.thickness_range_A
    if var.thin_fraction is not None and lo < hi:
        thin = sample_rng(seed, SampleStream.THIN_SHARE).uniform() < var.thin_fraction
        lo, hi = (lo, var.thin_below_A) if thin else (var.thin_below_A, hi)
    return float(sample_rng(seed, SampleStream.THICKNESS).uniform(lo, hi))


def uses_frozen_phonon(cfg: SimulationConfig, seed: int) -> bool:
    """Whether the sample with ``seed`` gets thermal displacements: every sample with
    ``variations.frozen_phonon``, or the ``frozen_phonon_fraction`` of them drawn on a stream of
    its own (namsa.random_streams), so the thickness, tilt and defocus draws stay as they were."""
    var = cfg.variations
    if not var.frozen_phonon:
        return False
    if var.frozen_phonon_fraction is None:
        return True
    return bool(sample_rng(seed, SampleStream.PHONON_FRACTION).uniform() < var.frozen_phonon_fraction)


def phonon_configurations(supercell: Any, cfg: SimulationConfig, rng: np.random.Generator, seed: int) -> list:
    """The atomic configurations one sample averages over: ``[supercell]`` without frozen phonons,
    else ``cfg.phonon_configs`` thermal displacements of it (Angstrom RMS per axis from
    ``cfg.variations.thermal_sigma_A``). The first is drawn from the sample's own ``rng``, exactly
    as when each sample was one snapshot (so phonon_configs = 1 keeps those samples and ids); the
    others from their own streams (namsa.random_streams), which leaves ``rng``'s later draws (tilt, defocus)
    independent of how many configurations are averaged."""
    if not uses_frozen_phonon(cfg, seed):
        return [supercell]
    from .kirkland import symbol
    from .thermal import thermal_displace

    sigma = cfg.variations.thermal_sigma_A
    if isinstance(sigma, (int, float)):
        sigma = {symbol(int(z)): float(sigma) for z in np.unique(supercell.numbers)}
    first = thermal_displace(supercell, rng, sigma)
    return [first] + [thermal_displace(supercell, sample_rng(seed, SampleStream.PHONON_CONFIGURATION, k), sigma)
                      for k in range(1, cfg.phonon_configs)]


def tilt_and_aberrations(cfg: SimulationConfig, rng: np.random.Generator) -> tuple[tuple[float, float], dict]:
    """The beam tilt (ty, tx) in mrad, uniform over the disc of radius ``variations.tilt_mrad``, and
    the aberrations {"C1_A", "C3_mm"} with defocus drawn from ``variations.defocus_range_A``; drawn
    from the sample's ``rng`` after its first phonon configuration (see phonon_configurations)."""
    var = cfg.variations
    tilt = (0.0, 0.0)
    if var.tilt_mrad > 0:
        radius, angle = var.tilt_mrad * math.sqrt(rng.uniform()), rng.uniform(0, 2 * math.pi)
        tilt = (radius * math.sin(angle), radius * math.cos(angle))
    c1 = cfg.aberrations.C1_A + (rng.uniform(*var.defocus_range_A) if var.defocus_range_A[0] != var.defocus_range_A[1]
                                 else 0.0)
    aberrations = {"C1_A": float(c1), "C3_mm": float(cfg.aberrations.C3_mm)}
    return tilt, aberrations
