"""Multislice ptychography of a sample's 4D-STEM stack through py4DSTEM's `MultislicePtychography`:
the reconstruction microscopists use on specimens too thick for one phase grating.

A separate file from `single_slice.py` (single slice) because the concern differs: how the specimen is
cut into slices from its recorded thickness, and how the slices' phases add up to one projected
potential. The calibrations, the stack check and the phase -> V * Angstrom conversion on the
target grid are `single_slice.py`'s, shared so both baselines use exactly the same geometry.

Slices: ``n = ceil(thickness_A / max_slice_A)`` slices of equal thickness ``thickness_A / n``
(``meta.thickness_A``, the simulated specimen's thickness). Output: the sum over slices of the
object phase, over sigma (phase = sigma V_p per slice, so the sum is the projected potential of the
whole specimen). The solver iterates to convergence on its own data error (`convergence.py`).
py4DSTEM's kz regularisation (``kz_regularization_gamma``) couples the slices, as its multislice
examples do; the value is stated in the settings, not tuned on the truth.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from namsa.sample_meta import SampleMeta

from .convergence import ConvergenceRule, iterate
from .single_slice import PtychoError, PtychoResult, checked_stack, phase_to_potential, prepared_solver, require_py4dstem


#: the thinnest slice (Angstrom) a setting may ask for: half the shortest distance between atoms in a
#: solid (~1 Angstrom), so no slice is thinner than one atom's potential; the depth resolution of
#: ptychography at the study's 200 kV, 20 mrad is lambda / alpha^2 ~ 60 Angstrom, so thinner slices
#: only multiply the unknowns (and 1e-300 asks for more slices than there are numbers)
MIN_SLICE_A = 0.5


class MultisliceSettings(BaseModel):
    """The ``evaluation.multislice_ptycho`` YAML section: which samples, and how they are sliced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_samples: int = Field(8, ge=1, description="run on at most this many samples (the first eligible ones)")
    min_thickness_A: float = Field(50.0, ge=0.0, description="only samples at least this thick (Angstrom)")
    max_slice_A: float = Field(20.0, ge=MIN_SLICE_A, description="slices are at most this thick (Angstrom)")
    batch_size: int = Field(64, ge=1, description="probe positions per gradient update")
    kz_regularization_gamma: float | None = Field(1.0, gt=0.0, description="py4DSTEM's kz filter; None = off")
    convergence: ConvergenceRule = Field(default_factory=lambda: ConvergenceRule(max_iterations=24))

    def eligible(self, meta: SampleMeta) -> bool:
        """True when the sample is thick enough for this baseline (thickness from its meta; unknown: not)."""
        return meta.thickness_A is not None and float(meta.thickness_A) >= self.min_thickness_A


@dataclass
class MultisliceResult(PtychoResult):
    """`PtychoResult` plus the slicing used: ``n_slices`` of ``slice_thickness_A`` (Angstrom) each."""

    n_slices: int = 1
    slice_thickness_A: float = 0.0


def slicing(thickness_A: float, max_slice_A: float) -> tuple[int, float]:
    """(number of slices, slice thickness in Angstrom): equal slices no thicker than ``max_slice_A``."""
    if not (math.isfinite(thickness_A) and thickness_A > 0):
        raise PtychoError(f"the sample's thickness_A is {thickness_A!r}; multislice ptychography needs the "
                          "specimen thickness in its meta: re-simulate with a current namsa")
    n = max(1, math.ceil(thickness_A / max_slice_A - 1e-9))
    return n, thickness_A / n


def multislice_solver(meta: SampleMeta, cbed4d: np.ndarray, positions: np.ndarray, n_slices: int, slice_A: float,
                      initial_object: np.ndarray | None = None) -> Any:
    """py4DSTEM's `MultislicePtychography` of ``n_slices`` slices of ``slice_A`` Angstrom, preprocessed;
    ``initial_object``: the (slices, p, q) start phase (rad) or None (`single_slice.prepared_solver`)."""
    from py4DSTEM.process.phase import MultislicePtychography

    return prepared_solver(MultislicePtychography, meta, cbed4d, positions, initial_object, num_slices=n_slices,
                           slice_thicknesses=slice_A)


def kz_arguments(gamma: float | None, n_slices: int) -> dict[str, Any]:
    """``reconstruct`` arguments of py4DSTEM's kz filter (``gamma`` None: off)."""
    # The kz filter couples slices; with one slice there is nothing to couple (and py4DSTEM fails).
    return dict(kz_regularization_filter=gamma is not None and n_slices > 1, kz_regularization_gamma=gamma)


def multislice_from_sample(sample: Any, settings: MultisliceSettings | None = None,
                           output_shape: Sequence[int] | None = None, seed: int = 0) -> MultisliceResult:
    """Multislice ptychography of ``sample.cbed`` on its target grid (V * Angstrom); never reads the truth."""
    require_py4dstem()
    settings = settings or MultisliceSettings()
    n, dz = slicing(sample.meta.thickness_or_nan_A, settings.max_slice_A)
    cbed4d, positions = checked_stack(sample)
    started = time.perf_counter()
    solver = multislice_solver(sample.meta, cbed4d, positions, n, dz)
    log = iterate(solver, settings.convergence, max_batch_size=settings.batch_size, seed_random=int(seed),
                  object_positivity=False, **kz_arguments(settings.kz_regularization_gamma, n))
    seconds = time.perf_counter() - started
    phase = np.asarray(solver.object, dtype=np.float64).sum(axis=0)   # (slices, y, x) -> projected
    potential = phase_to_potential(phase, solver, sample, positions, output_shape)
    return MultisliceResult(potential, seconds, log.errors[-1], log.iterations, log.errors, log.converged,
                            n_slices=n, slice_thickness_A=dz)


__all__ = ["MultisliceSettings", "MultisliceResult", "multislice_from_sample", "multislice_solver", "kz_arguments",
           "slicing"]
