"""The evaluation's methods, one record each: the one place that says which methods exist, what
they are called, how they are drawn, what they produce and how they are run. Scoring, aggregation,
the verdict, the report, the figures, the dose sweep, the baseline precompute and the scaling study
read `REGISTRY`; none keeps a list of method names of its own.

Adding a baseline: a file in ``evaluation/baselines/`` with its map function (sample and the targets'
grid shape -> map in physical units and the facts of its computation; it never sees the truth), and one
`Method` entry below (docs/architecture.md). Scoring puts every map into the views (`evaluation.views`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from .baselines import icom_baseline, multislice_baseline, ptycho_baseline
from .baselines.cache import Baseline, cached
from .baselines.refined import refined_from_network
from .baselines.thick_subset import ThickSubset
from .config import EvaluationConfig

#: the names other modules refer to a method by (a method's name is also its metrics.json key).
NETWORK, MEAN, ICOM, PTYCHO, MULTISLICE_PTYCHO = "network", "mean", "icom", "ptycho", "multislice_ptycho"
NETWORK_PTYCHO = "network+ptycho"
#: every target a map can be made of (V*Angstrom potential, electrons/Angstrom^2 density).
ALL_TARGETS: tuple[str, ...] = ("potential", "density")

#: (config, sample, the targets' grid shape (T, T), the network's maps of the sample {target: (T, T)})
#: -> (map in physical units, facts of its computation); only a method that starts from the network
#: (network+ptycho) reads the network's maps, none reads the truth.
Runner = Callable[[EvaluationConfig, Any, tuple[int, ...], dict[str, np.ndarray]], Baseline]


class Subset(Protocol):
    """Which samples a costly method runs on, decided sample by sample in scoring order."""

    def take(self, meta: dict) -> bool:
        """True (and counted) when the sample with this meta gets the method."""

    def note(self) -> str:
        """The sentence recorded in each of its records: which samples the method was scored on."""


@dataclass(frozen=True)
class Method:
    """One evaluated method.

    name:          metrics.json key of its scores, records (``<name>_fit``), times and cache folder.
    label:         its name in the report's tables ("ptychography (py4DSTEM)").
    short_label:   the short name of per-sample columns ("iCoM rel L2") and of the figures.
    verdict_label: what a verdict sentence calls it ("the network beats the iCoM baseline").
    colour:        its matplotlib colour in every figure.
    targets:       the targets it makes maps of.
    legacy_fitted: what the legacy view (`views.LEGACY`, the headline before issue 30) did with it:
                   least-squares scaled and offset to the truth per sample (`baselines.fitted.fit_to_truth`).
                   Under the headline (the field's rule) no method is scaled; each keeps its units.
                   Such a method's ``<name>_fit`` record holds that fit beside its computation's facts.
    timed:         its compute time per sample (s) is recorded and reported.
    judged:        the verdict decides whether the network beats it.
    dose_sweep:    scored again on shot-noised patterns (costly reconstructions are left out).
    panel_order:   position in the sample panels, per-sample columns and figure references
                   (reconstructions from the stack first, the mean image last).
    enabled:       whether a configuration asks for it (its switch in `EvaluationConfig`).
    runner:        its per-sample map from the CBED stack; None for the network (the model's
                   prediction) and the mean image (computed once from the training split).
    settings:      what its cached maps depend on (the cache digest); None: not cached.
    subset:        None (every sample) or the rule picking the samples it runs on.
    fit_convention: metrics.json's description of ``<name>_fit`` (legacy-fitted methods).
    missing_note:  why a table may lack it, said under the table when it does (``{why}``: the reason
                   metrics.json's ``absent_baselines`` records for it, else "not computed").
    """

    name: str
    label: str
    short_label: str
    verdict_label: str
    colour: str
    targets: tuple[str, ...]
    legacy_fitted: bool
    timed: bool
    judged: bool
    dose_sweep: bool
    panel_order: int
    enabled: Callable[[EvaluationConfig], bool]
    runner: Runner | None = None
    settings: Callable[[EvaluationConfig], Any] | None = None
    subset: Callable[[EvaluationConfig], Subset] | None = None
    fit_convention: str = ""
    missing_note: str = ""

    @property
    def figure_label(self) -> str:
        """Its legend and panel title: a reconstruction's short name (its label names the solver)."""
        return self.short_label if self.runner is not None else self.label

    def compute(self, cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...], network: dict[str, np.ndarray],
                subset: Subset | None = None) -> tuple[np.ndarray, dict[str, Any], float]:
        """(map in physical units on a ``shape`` grid, facts, seconds) of one sample, through
        ``cfg.baseline_cache`` when the method is cached (a model-independent method only); ``network``:
        the network's maps of this sample, for a method that starts from them. The seconds are the runner's own (an iterative
        solver's, or the original ones of a cached map) when its facts record them, else the wall time
        of this call."""
        if self.runner is None:
            raise TypeError(f"{self.name} has no per-sample runner (its maps come from the model or the training split)")
        started = time.perf_counter()
        shape = tuple(int(n) for n in shape)
        if self.settings is None:
            result, facts = self.runner(cfg, sample, shape, network)
        else:
            result, facts = cached(cfg.baseline_cache, self.name, sample.meta["sample_id"], self.settings(cfg),
                                   lambda: self.runner(cfg, sample, shape, network))
        seconds = facts.get("seconds", time.perf_counter() - started)
        # Marked: a subset method's aggregates cover only the samples it ran on.
        return result, ({**facts, "subset": subset.note()} if subset is not None else facts), seconds


def _ptycho(cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...], network: dict[str, np.ndarray]) -> Baseline:
    return ptycho_baseline(sample, shape, cfg.ptycho_iterations, cfg.ptycho_batch_size, cfg.ptycho_convergence)


def _multislice(cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...],
                network: dict[str, np.ndarray]) -> Baseline:
    return multislice_baseline(sample, shape, cfg.multislice_ptycho)


def _network_ptycho(cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...],
                    network: dict[str, np.ndarray]) -> Baseline:
    return refined_from_network(cfg.network_ptycho, sample, network["potential"])


#: how every legacy fit record (``<name>_fit``) reads, after the method's own sentence.
_LEGACY_FIT = ("scale, offset: the legacy rule's least-squares fit of the map to the truth per sample, "
               "with scale >= 0 (a map that would need a negative scale gets scale 0: the best constant); "
               "signed_scale: the unconstrained scale (negative: the map was anti-correlated with the truth). "
               "The same fit makes its structure view; its headline (field) view uses none of it")


REGISTRY: tuple[Method, ...] = (
    Method(NETWORK, "network", "network", "network", "tab:blue", ALL_TARGETS, legacy_fitted=False, timed=True,
           judged=False, dose_sweep=True, panel_order=0, enabled=lambda cfg: True),
    Method(MEAN, "mean training target", "mean", "mean training target", "tab:gray", ALL_TARGETS, legacy_fitted=False,
           timed=False, judged=True, dose_sweep=True, panel_order=4, enabled=lambda cfg: cfg.mean_baseline,
           missing_note="the mean-training-target baseline is absent: {why}"),
    Method(ICOM, "iCoM (calibrated)", "iCoM", "iCoM baseline", "tab:orange", ("potential",),
           legacy_fitted=True, timed=True, judged=True, dose_sweep=True, panel_order=1, enabled=lambda cfg: cfg.icom,
           runner=lambda cfg, sample, shape, network: icom_baseline(sample, shape),
           fit_convention="iCoM map calibrated by the detector sampling (V*Angstrom). " + _LEGACY_FIT,
           missing_note="iCoM was not computed (it estimates the potential only; or evaluation.icom is off)"),
    Method(PTYCHO, "ptychography (py4DSTEM)", "ptychography", "ptychography baseline",
           "tab:green", ("potential",), legacy_fitted=True, timed=True, judged=True, dose_sweep=False, panel_order=2,
           enabled=lambda cfg: cfg.ptycho, runner=_ptycho,
           settings=lambda cfg: (cfg.ptycho_iterations, cfg.ptycho_batch_size, cfg.ptycho_convergence),
           fit_convention="single-slice ptychography (py4DSTEM) phase / interaction constant (V*Angstrom) at the "
                          "targets' resolution; seconds, error, iterations run and converged (stopped by the "
                          "data-error rule, not the cap). " + _LEGACY_FIT,
           missing_note="ptychography was not computed (evaluation.ptycho is off, or the target is not the "
                        "potential)"),
    Method(MULTISLICE_PTYCHO, "multislice ptychography (py4DSTEM; thick subset only)",
           "multislice ptychography", "multislice ptychography baseline (on its subset of samples)", "tab:red",
           ("potential",), legacy_fitted=True, timed=True, judged=True, dose_sweep=False, panel_order=3,
           enabled=lambda cfg: cfg.multislice_ptycho is not None, runner=_multislice,
           settings=lambda cfg: cfg.multislice_ptycho, subset=lambda cfg: ThickSubset(cfg.multislice_ptycho),
           fit_convention="multislice ptychography (py4DSTEM; n_slices of slice_thickness_A from the sample's "
                          "thickness), slices' phases summed / interaction constant (V*Angstrom) at the targets' "
                          "resolution, facts as ptycho_fit; computed on a subset only (subset says which), so its "
                          "aggregates' n is smaller. " + _LEGACY_FIT,
           missing_note="multislice ptychography was not computed (evaluation.multislice_ptycho is off, or the "
                        "target is not the potential)"),
    # Not cached: its map depends on the model. Not legacy-fitted: it postdates the legacy rule. Not judged:
    # the verdict is the network against what microscopists have; this is ours, shown beside it.
    Method(NETWORK_PTYCHO, "network refined by ptychography (py4DSTEM, started from the network's map)",
           "network+ptycho", "network refined by ptychography", "tab:purple", ("potential",), legacy_fitted=False,
           timed=True, judged=False, dose_sweep=False, panel_order=5, enabled=lambda cfg: cfg.network_ptycho is not None,
           runner=_network_ptycho,
           missing_note="network+ptycho was not computed (evaluation.network_ptycho is off, or the target is not "
                        "the potential)"),
)

_BY_NAME: dict[str, Method] = {m.name: m for m in REGISTRY}


def method(name: str) -> Method:
    """The record of the method called ``name`` (KeyError for an unknown name)."""
    return _BY_NAME[name]


def names() -> tuple[str, ...]:
    """Every method's name in the tables' order (network first)."""
    return tuple(_BY_NAME)


def in_panel_order(methods: Any = REGISTRY) -> list[Method]:
    """``methods`` (records) sorted as the sample panels and per-sample columns show them."""
    return sorted(methods, key=lambda m: m.panel_order)


def baselines() -> list[Method]:
    """Every method but the network, in the tables' order."""
    return [m for m in REGISTRY if m.name != NETWORK]


def per_sample(cfg: EvaluationConfig, target: str) -> list[Method]:
    """The methods ``cfg`` asks for that compute a map of ``target`` sample by sample from its stack."""
    return [m for m in REGISTRY if m.runner is not None and target in m.targets and m.enabled(cfg)]
