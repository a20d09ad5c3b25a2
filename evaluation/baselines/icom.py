"""The iCoM baseline: its record (the reference the network is compared with sample by sample) and its
map. The math is imported from `namsa.icom` where it lives (the loader's physics input channels,
`stage.physics_inputs`, use the same code; layering: evaluation -> stage -> namsa)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from namsa.icom import (ICoMInputError, center_of_mass, fourier_resample, icom_from_sample, icom_reconstruct,
                        integrate_gradient, integrate_gradient_mirrored, interaction_constant, wavelength_A)

from .cache import Baseline
from .record import Method


def icom_baseline(sample: Any, shape: Sequence[int]) -> Baseline:
    """iCoM of ``sample`` on a ``shape`` grid, calibrated by its detector sampling (V*Angstrom;
    `namsa.icom.icom_from_sample`), and no facts ({})."""
    # Not smoothed to the targets' resolution: iCoM is already blurred by the probe (its resolution is
    # the incoherent probe's, about the targets'), and a second blur measurably lowers its score.
    return np.asarray(icom_from_sample(sample, output_shape=tuple(shape)), dtype=np.float32), {}


METHOD = Method(
    name="icom", label="iCoM (calibrated)", short_label="iCoM", verdict_label="iCoM baseline",
    description="the integrated centre of mass of the same 4D stack, calibrated by the detector sampling: a "
                "projected potential in V*Angstrom",
    colour="tab:orange", targets=("potential",), legacy_fitted=True, judged=True, dose_sweep=True, panel_order=1,
    switch="icom", timing="that sample's reconstruction",
    reference="iCoM assumes a thin, weak-phase specimen; thick crystals and heavy elements (channelling, "
              "dynamical scattering) break that assumption, so iCoM is expected to fall behind there.",
    runner=lambda cfg, sample, shape, network: icom_baseline(sample, shape),
    fit_convention="iCoM map calibrated by the detector sampling (V*Angstrom)",
    missing_note="iCoM was not computed (it estimates the potential only; or evaluation.icom is off)")

__all__ = ["METHOD", "icom_baseline", "icom_reconstruct", "icom_from_sample", "center_of_mass", "integrate_gradient",
           "integrate_gradient_mirrored", "fourier_resample", "wavelength_A", "interaction_constant",
           "ICoMInputError"]
