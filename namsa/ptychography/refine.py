"""A learned start refined by physics: ptychography (py4DSTEM) started from a network's projected
potential instead of from zero phase, kept only where it explains the data better.

Where the network's forward model is weakest (thin, light, weak-phase specimens) ptychography's is
nearly exact, but it starts from nothing; the network's map is a far better start. Steps:

1. Start object: the network's map (T, T) in V * Angstrom times sigma
   (`namsa.constants.interaction_constant`) is the phase, moved from the target grid onto py4DSTEM's
   padded, finer object grid (`object_grid.target_coordinates` / `from_target_grid`, the inverse of the
   read-back). The probe at the edge positions reaches beyond the scanned field; there the map is
   continued **periodically** when the field of view is one whole period of a simulated supercell
   (``fov_A`` spans ``cell_A``: the specimen beyond the edge *is* the map again, so the start agrees
   with the data everywhere the probe goes), and with **its mean** otherwise (a microscope tile or a
   partial field: what lies beyond is unknown, and a flat phase adds no structure the data would
   have to remove). ``RefineSettings.outside`` forces either.
2. Solver: single-slice ptychography, or multislice (`multislice.py`) for specimens at least
   ``multislice_from_A`` thick (``meta.thickness_A``), the start phase split evenly over the
   slices. py4DSTEM takes the start as its constructor's ``initial_object_guess`` (for
   ``object_type="potential"`` a real float32 phase array of exactly the padded object's shape, (p, q)
   or (slices, p, q)); that shape is py4DSTEM's own, read from a first solver preprocessed without a
   guess (cheap: tens of ms), whose geometry the second solver then shares exactly.
3. Iterate on the solver's own data error (`convergence.iterate`), the probe refined with the object.
   With ``prior_weight`` w > 0, after every iteration the object moves back towards the start by
   that fraction, O <- (1 - w) O + w O_start: the proximal step of a Gaussian prior centred on the
   network's map (gradient steps on the data alternating with shrinkage towards the prior, as in
   proximal-gradient MAP estimation). w = 0 (the default) is plain ptychography from the start: on the
   study's dev split every w > 0 tried made every class worse (benchmarks/refine_dev.py), as the probe,
   refined with the object, absorbs what the object is held back from explaining.
4. Judge: the data error of the start and of the result, each by one forward pass over every probe
   position that changes nothing: py4DSTEM's ``_return_self_consistency_errors`` (the per-position
   misfit sum |A - |F(P O)||^2 / mean intensity that its ``reconstruct`` sums during an iteration and
   its uncertainty visualisation reads back; its mean is exactly ``reconstruct``'s normalised error,
   which we checked against a first iteration run as one batch). ``reconstruct``'s own error is
   accumulated while the object changes batch by batch, so it is not the start's error. Where the
   result's error is above the start's, or non-finite (diverged), **the network's map is returned
   unchanged** (``kept_network``). Decided on the data alone, never on a truth.
5. A uniform phase does not change the data, so the refined map's mean is set to the network map's.

Specimens at least ``refine_below_A`` thick (``meta.thickness_A``; default 50 A) are not refined: the
network's map is returned (``skipped`` says why). There the single-slice forward model no longer holds
and a lower data error is not a better map; on the study's dev split refining them made the maps worse
than the network's at 50-100 A (0.202 against 0.122) and multislice did not rescue them at 100 A and more
(0.246 against 0.116), while below 50 A refining beat both the network and ptychography
(benchmarks/refine_dev.py; benchmarks/RESULTS.md, "network+ptycho's settings chosen on dev"). A stack
of unknown thickness (a microscope file) is refined. Nor is a map whose phase spans ``max_phase_rad`` or
more (sigma * (max - min) of the network's own map; default 0.75 rad): beyond the weak-phase regime the
solver's gradient descent from a strong phase lands in wrong minima (thin specimens of In, Eu, W, Hg
compounds on dev: refined 0.13-0.36 against the network's 0.05-0.15), and the network's map is kept. Both
rules read only the meta and the network's map, never the truth.

Nothing here reads ``sample.potential`` or ``sample.density``.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from namsa.constants import interaction_constant
from namsa.sample_meta import SampleMeta
from namsa.random_streams import MAX_SEED

from .convergence import ConvergenceRule, iterate
from .multislice import MIN_SLICE_A, kz_arguments, multislice_solver, slicing
from .object_grid import from_target_grid, target_coordinates
from .single_slice import PtychoError, checked_stack, phase_to_potential, prepared_solver, require_py4dstem

#: py4DSTEM seeds numpy's legacy generator, which takes seeds below 2**32: a config seed (up to MAX_SEED,
#: as every seed) wraps into that range
PY4DSTEM_SEEDS = 2**32
#: the meta keys a refinement reads (besides one detector sampling: pattern_dk_inv_A or pattern_mrad_per_px)
REQUIRED_META = ("scan_shape", "scan_positions_A", "fov_A", "energy_kv", "semiangle_mrad")


class RefineSettings(BaseModel):
    """How a network's map is refined (`refine_from_sample`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    convergence: ConvergenceRule = Field(default_factory=ConvergenceRule,
                                         description="stop rule and step schedule on the solver's data error")
    batch_size: int = Field(64, ge=1, description="probe positions per gradient update")
    multislice_from_A: float | None = Field(100.0, gt=0.0, description="specimens at least this thick (Angstrom) "
                                            "get multislice ptychography; None: always single-slice")
    max_slice_A: float = Field(20.0, ge=MIN_SLICE_A, description="multislice: slices at most this thick (Angstrom)")
    kz_regularization_gamma: float | None = Field(1.0, gt=0.0, description="multislice: py4DSTEM's kz filter")
    outside: Literal["auto", "periodic", "mean"] = Field(
        "auto", description="the start beyond the scanned field: auto = periodic when the field is one period of "
                            "the specimen (fov_A spans cell_A), else the map's mean")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="py4DSTEM's batch-shuffling seed")
    refine_below_A: float | None = Field(50.0, gt=0.0, description="refine only specimens thinner than this "
                                         "(Angstrom, meta thickness_A; unknown thickness: refined); thicker ones "
                                         "keep the network's map. None: refine every thickness")
    max_phase_rad: float | None = Field(0.75, gt=0.0, description="refine only where the network's map spans "
                                        "less phase than this, sigma * (max - min) in rad (a weak phase object); "
                                        "None: any phase")
    prior_weight: float = Field(0.0, ge=0.0, lt=1.0, description="after every iteration the object moves this "
                                "fraction back towards the network's start (a Gaussian prior's proximal step); "
                                "0 = plain ptychography from the network's start")

    def slices(self, meta: SampleMeta) -> tuple[int, float]:
        """(slices, slice thickness in Angstrom): one slice below ``multislice_from_A`` or without a
        known thickness, else `multislice.slicing`."""
        thickness = meta.thickness_or_nan_A
        if self.multislice_from_A is None or not thickness >= self.multislice_from_A:
            return 1, thickness
        return slicing(thickness, self.max_slice_A)

    def too_thick(self, meta: SampleMeta) -> str | None:
        """Why a specimen of ``meta.thickness_A`` is not refined (see the module docstring), or None."""
        thickness = meta.thickness_or_nan_A
        if self.refine_below_A is not None and thickness >= self.refine_below_A:
            return f"{thickness:.0f} A thick, not below refine_below_A={self.refine_below_A:g} A"
        return None

    def too_strong(self, network: np.ndarray, meta: SampleMeta) -> str | None:
        """Why the network's map (V * Angstrom) is too strong a phase to refine (see the module
        docstring), or None."""
        span = interaction_constant(float(meta.energy_kv)) * float(np.ptp(network))
        if self.max_phase_rad is not None and span >= self.max_phase_rad:
            return f"the network's map spans {span:.2f} rad of phase, not below max_phase_rad={self.max_phase_rad:g}"
        return None

    def periodic(self, meta: SampleMeta) -> bool:
        """Whether the start continues periodically beyond the scanned field (see the module docstring)."""
        if self.outside != "auto":
            return self.outside == "periodic"
        return meta.fov_is_one_period is True   # a microscope tile (no cell) is a window, not a period


@dataclass
class RefineResult:
    """A network's potential refined by ptychography.

    potential:    (T, T) projected potential, V * Angstrom, float32, [row = y, col = x] on the network
                  map's grid; the network's map itself when ``kept_network``.
    seconds:      wall time of both preprocesses, the iterations and the two error passes (s).
    start_error:  py4DSTEM's normalised data error of the network's start (dimensionless).
    final_error:  the same of the refined object and probe (NaN or inf: diverged).
    iterations:   passes over every probe position run.
    converged:    the stop rule (not the cap) ended the iterations.
    kept_network: the refinement raised the data error or diverged, so the network's map was returned.
    n_slices:     1 for single-slice ptychography, else the multislice slices.
    errors:       py4DSTEM's error after each iteration (accumulated while the object changes).
    skipped:      why the stack was not refined at all (then ``kept_network``, no errors), or None.
    """

    potential: np.ndarray
    seconds: float
    start_error: float
    final_error: float
    iterations: int
    converged: bool
    kept_network: bool
    n_slices: int = 1
    errors: list[float] = field(default_factory=list)
    skipped: str | None = None

    def record(self) -> dict[str, Any]:
        """Everything but the map, JSON-ready (what reconstruction.json and the evaluation record)."""
        facts = asdict(self)
        del facts["potential"]
        return facts


def missing_meta(meta: Any) -> list[str]:
    """The calibrations a refinement needs that ``meta`` lacks (empty: it has them all)."""
    if not isinstance(meta, SampleMeta):
        return list(REQUIRED_META) + ["pattern_dk_inv_A"]
    missing = meta.missing(REQUIRED_META)
    if meta.pattern_dk_inv_A is None and meta.pattern_mrad_per_px is None:
        missing.append("pattern_dk_inv_A (or pattern_mrad_per_px)")
    return missing


def refine_from_sample(sample: Any, network_potential: np.ndarray,
                       settings: RefineSettings | None = None) -> RefineResult:
    """Ptychography of ``sample.cbed`` (S, P, P) with ``sample.meta``'s calibrations, started from
    ``network_potential`` (T, T, V * Angstrom, over ``meta.fov_A``); see the module docstring.
    Reads only ``sample.cbed`` and ``sample.meta``; raises `PtychoError` (one line) on bad input."""
    require_py4dstem()
    settings = settings or RefineSettings()
    network = _checked_map(network_potential)
    meta = sample.meta
    missing = missing_meta(meta)
    if missing:
        raise PtychoError(f"refining needs the scan's calibrations in its meta; missing: {', '.join(missing)}")
    cbed4d, positions = checked_stack(sample)
    skipped = settings.too_thick(meta) or settings.too_strong(network, meta)
    if skipped:
        return RefineResult(network, seconds=0.0, start_error=math.nan, final_error=math.nan, iterations=0,
                            converged=False, kept_network=True, n_slices=0, skipped=skipped)
    n, dz = settings.slices(meta)
    started = time.perf_counter()

    def build(initial: np.ndarray | None) -> Any:
        if n == 1:
            from py4DSTEM.process.phase import SingleslicePtychography

            return prepared_solver(SingleslicePtychography, meta, cbed4d, positions, initial)
        return multislice_solver(meta, cbed4d, positions, n, dz, initial)

    solver = build(_start_phase(network, build(None), meta, positions, settings.periodic(meta), n))
    start_error = data_error(solver, settings.batch_size)
    log = iterate(solver, settings.convergence, after_iteration=_pull_towards_start(settings.prior_weight),
                  max_batch_size=settings.batch_size, seed_random=settings.seed % PY4DSTEM_SEEDS,
                  object_positivity=False, **(kz_arguments(settings.kz_regularization_gamma, n) if n > 1 else {}))
    final_error = data_error(solver, settings.batch_size)
    phase = np.asarray(solver.object, dtype=np.float64)
    phase = phase.sum(axis=0) if phase.ndim == 3 else phase   # slices -> projected
    kept = not (math.isfinite(final_error) and final_error <= start_error and np.all(np.isfinite(phase)))
    if kept:
        potential = network
    else:
        potential = phase_to_potential(phase, solver, sample, positions, network.shape)
        potential = (potential + (network.mean(dtype=np.float64) - potential.mean(dtype=np.float64))).astype(np.float32)
    return RefineResult(potential, time.perf_counter() - started, start_error, final_error, log.iterations,
                        log.converged, kept, n, log.errors)


def _pull_towards_start(weight: float) -> Any:
    """The prior's proximal step O <- (1 - w) O + w O_start on py4DSTEM's object (``_object``, its
    start ``_object_initial``: the network's phase, set by the first ``reconstruct(reset=True)``);
    None for w = 0."""
    if weight <= 0.0:
        return None

    def pull(solver: Any) -> None:
        solver._object = (1.0 - weight) * solver._object + weight * solver._object_initial

    return pull


def data_error(solver: Any, batch_size: int) -> float:
    """py4DSTEM's normalised data error of the solver's current object and probe, changing neither:
    one forward pass over every probe position (see the module docstring, step 4)."""
    errors = solver._return_self_consistency_errors(max_batch_size=int(batch_size))
    return float(np.mean(errors))


def _checked_map(potential: Any) -> np.ndarray:
    """The network's map as a finite float32 (T, T) array, or a one-line `PtychoError`."""
    image = np.asarray(potential, dtype=np.float32)
    if image.ndim != 2 or min(image.shape) < 2:
        raise PtychoError(f"the network's potential must be one (T, T) map, got shape {image.shape}; pass the "
                          "potential channel of one prediction")
    if not np.all(np.isfinite(image)):
        raise PtychoError(f"the network's potential holds {int((~np.isfinite(image)).sum())} non-finite values; "
                          "refine only a finite map")
    return image


def _start_phase(network: np.ndarray, geometry: Any, meta: SampleMeta, positions: np.ndarray,
                 periodic: bool, n_slices: int) -> np.ndarray:
    """The start phase sigma * V (rad) on the object grid of ``geometry`` (a solver preprocessed
    without a guess): (p, q), or (slices, p, q) holding 1 / n of it in every slice."""
    # py4DSTEM's padded object shape: set by preprocess, public only after a reconstruct.
    object_shape = tuple(geometry._object_shape[-2:])
    coords = target_coordinates(meta, network.shape, object_shape, positions, np.asarray(geometry.positions),
                                geometry.sampling)
    phase = from_target_grid(network, coords, geometry.sampling, meta, periodic)
    phase *= interaction_constant(float(meta.energy_kv))
    if n_slices == 1:
        return phase.astype(np.float32)
    return np.repeat((phase / n_slices)[None].astype(np.float32), n_slices, axis=0)


__all__ = ["RefineSettings", "RefineResult", "refine_from_sample", "data_error", "missing_meta", "REQUIRED_META"]
