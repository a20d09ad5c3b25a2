"""`EvaluationConfig`: what `evaluate` measures and draws (the ``evaluation:`` YAML section)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from namsa.random_streams import MAX_SEED

from namsa.ptychography.convergence import ConvergenceRule
from namsa.ptychography.multislice import MultisliceSettings
from namsa.ptychography.refine import RefineSettings

TargetName = Literal["potential", "density"]


class EvaluationConfig(BaseModel):
    """Knobs of the evaluation; every field has a default, so ``EvaluationConfig()`` works.

    split:             which split of the data to evaluate (held-out materials: ``test``), or ``all``
                       (every sample of every split: training materials included, so not a
                       held-out figure; the report says so).
    targets:           targets to score (``potential`` in V*Angstrom, ``density`` in
                       electrons/Angstrom^2); None = every target the model predicts.
    max_samples:       evaluate at most this many samples of the split (None = all), in store order.
    batch_size:        samples per `Reconstructor.predict` call.
    icom:              compute the integrated centre-of-mass baseline (potential only).
    ptycho:            compute the single-slice ptychography baseline (potential only; py4DSTEM,
                       ``pip install 'namsa[baselines]'``). Off by default: it iterates to
                       convergence, seconds per sample on a 2-core CPU (docs/evaluation.md), more
                       than the whole network evaluation.
    ptycho_iterations: None (default): iterate until the solver's data error stops falling
                       (``ptycho_convergence``); an integer: exactly that many passes over every
                       probe position (the old, unconverged baseline, kept for comparison).
    ptycho_convergence: the stop rule on py4DSTEM's own data error (window, rel_tol,
                       max_iterations, step_size, min_step_size), never on the truth.
    ptycho_batch_size: probe positions per gradient update of the reconstruction.
    multislice_ptycho: None (default: off) or ``{max_samples, min_thickness_A, max_slice_A,
                       batch_size, kz_regularization_gamma, convergence}``: multislice
                       ptychography (py4DSTEM) on at most ``max_samples`` samples at least
                       ``min_thickness_A`` thick (the first ones in store order), scored only on those.
    network_ptycho:    None (default: off) or ``{convergence, batch_size, refine_below_A, max_phase_rad,
                       multislice_from_A, max_slice_A, kz_regularization_gamma, outside, seed,
                       prior_weight}``: the ``network+ptycho`` method, the network's potential refined by
                       ptychography started from it (`namsa.ptychography.refine`: only specimens thinner
                       than ``refine_below_A``, default 50 A, whose network map spans less than
                       ``max_phase_rad``, default 0.75 rad, both chosen on dev; multislice at least
                       ``multislice_from_A`` thick when refine_below_A allows it), kept where refining
                       raises the solver's data error (never decided on the truth).
    symmetry_average:  the network's maps averaged over the square group's 8 turns of each stack
                       (`Reconstructor.predict`, `models.symmetry_average`; 8 network passes); False:
                       the single pass, as the model cards' figures were made.
    baseline_cache:    None (default) or a directory where the model-independent ptychography and
                       multislice-ptychography maps are kept per sample and settings
                       (`evaluation.baselines.cache`): a second evaluation of the same data, e.g. of
                       another model, reuses them (their ``seconds`` stay the original compute time).
    mean_baseline:     compute the mean-training-target baseline (needs training samples in the
                       evaluated stores; without them it is absent and the report, the verdicts
                       and metrics.json's ``absent_baselines`` say why).
    n_panels:          samples drawn as per-sample panels (the first ones of the split).
    n_cbed_panels:     CBED patterns shown in each per-sample panel.
    worst_k:           worst samples (by network relative L2) listed and drawn in the report.
    n_bootstrap:       bootstrap resamples for the confidence intervals (0: no interval); the
                       bootstrap resamples materials, each bringing all of its samples.
    ci_level:          confidence level of the intervals.
    seed:              seed of the bootstrap; 0 <= seed < 2**63, as every seed of the config.
    column_threshold_rel: a local maximum counts as an atomic column when it rises above
                       min + threshold_rel * ptp of its map.
    column_min_distance_px: maxima closer than this (pixels) are merged.
    thickness_bins_A:  edges (Angstrom) of the thickness classes in the breakdowns.
    doses:             electron doses (electrons/Angstrom^2, each > 0) at which the network, iCoM and
                       the mean image are scored again on the same Poisson-noised patterns
                       (`evaluation.dose_sweep`; ptychography left out); [] (default): noise-free only.
    """

    model_config = ConfigDict(extra="forbid")

    split: Literal["train", "dev", "test", "all"] = "test"
    targets: list[TargetName] | None = None
    max_samples: int | None = Field(None, ge=1)
    batch_size: int = Field(4, ge=1)
    icom: bool = True
    ptycho: bool = False
    ptycho_iterations: int | None = Field(None, ge=1)
    ptycho_convergence: ConvergenceRule = Field(default_factory=ConvergenceRule)
    ptycho_batch_size: int = Field(64, ge=1)
    multislice_ptycho: MultisliceSettings | None = None
    network_ptycho: RefineSettings | None = None
    symmetry_average: bool = True
    baseline_cache: str | None = None
    mean_baseline: bool = True
    n_panels: int = Field(3, ge=0)
    n_cbed_panels: int = Field(3, ge=0, le=8)
    worst_k: int = Field(3, ge=0)
    n_bootstrap: int = Field(1000, ge=0)
    ci_level: float = Field(0.95, gt=0.0, lt=1.0)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    column_threshold_rel: float = Field(0.3, ge=0.0, lt=1.0)
    column_min_distance_px: int = Field(1, ge=1)
    thickness_bins_A: list[float] = Field(default_factory=lambda: [50.0, 150.0])
    doses: list[Annotated[float, Field(gt=0.0, allow_inf_nan=False)]] = Field(default_factory=list, max_length=12)

    def split_filter(self) -> str | None:
        """The split to ask the stores for (`stage.StoreSet.indices`): None for ``all``."""
        return None if self.split == "all" else self.split
