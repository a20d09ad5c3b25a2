"""The iCoM baseline's math, imported from `namsa.icom` where it lives (the loader's physics input
channels, `stage.physics_inputs`, use the same code; layering: evaluation -> stage -> namsa)."""
from __future__ import annotations

from namsa.icom import (ICoMInputError, center_of_mass, fourier_resample, icom_from_sample, icom_reconstruct,
                        integrate_gradient, integrate_gradient_mirrored, interaction_constant, wavelength_A)

__all__ = ["icom_reconstruct", "icom_from_sample", "center_of_mass", "integrate_gradient",
           "integrate_gradient_mirrored", "fourier_resample", "wavelength_A", "interaction_constant",
           "ICoMInputError"]
