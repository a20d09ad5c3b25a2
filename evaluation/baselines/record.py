"""What one evaluated method is: the `Method` record each baseline module declares beside its runner
(``METHOD``), and that `evaluation.methods.REGISTRY` assembles with the network's. It lives here, under
the baselines, because a baseline module imports it and the registry imports the baselines: one way.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from namsa.errors import UserError
from namsa.sample_meta import SampleMeta

from ..config import EvaluationConfig
from .cache import Baseline, cached

#: every target a map can be made of (V*Angstrom potential, electrons/Angstrom^2 density).
ALL_TARGETS: tuple[str, ...] = ("potential", "density")

#: (config, sample, the targets' grid shape (T, T), the network's maps of the sample {target: (T, T)})
#: -> (map in physical units, facts of its computation); only a method that starts from the network
#: (network+ptycho) reads the network's maps, none reads the truth.
Runner = Callable[[EvaluationConfig, Any, tuple[int, ...], dict[str, np.ndarray]], Baseline]


class RequirementError(UserError):
    """A method the configuration asks for needs a package that is not installed."""


@dataclass(frozen=True)
class Requirement:
    """An optional package a method imports, checked before a run (`evaluation.methods.check_requirements`).

    module:  the module to import ("py4DSTEM.process.phase"); importing it once also keeps the one-off
             import out of the first sample's timing.
    package: its name in messages ("py4DSTEM").
    install: how to install it ("pip install 'namsa[baselines]' (py4dstem-lite)").
    """

    module: str
    package: str
    install: str


class Subset(Protocol):
    """Which samples a costly method runs on, decided sample by sample in scoring order."""

    def take(self, meta: SampleMeta) -> bool:
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
    description:   what it is, in a phrase: the report's list of baselines and docs/evaluation.md's table.
    colour:        its matplotlib colour in every figure.
    targets:       the targets it makes maps of.
    legacy_fitted: what the legacy view (`views.LEGACY`, the headline before issue 30) did with it:
                   least-squares scaled and offset to the truth per sample (`baselines.fitted.fit_to_truth`).
                   Under the headline (the field's rule) no method is scaled; each keeps its units.
                   Such a method's ``<name>_fit`` record holds that fit beside its computation's facts.
    judged:        the verdict decides whether the network beats it.
    dose_sweep:    scored again on shot-noised patterns (costly reconstructions are left out).
    panel_order:   position in the sample panels, per-sample columns and figure references
                   (reconstructions from the stack first, the mean image last).
    switch:        the `EvaluationConfig` field that asks for it (a bool, or settings that are None when
                   off); None: always computed (the network).
    timing:        what its recorded compute seconds per sample measure (metrics.json's conventions);
                   "": not timed.
    reference:     set on the one method the network is compared with sample by sample
                   (``network_vs_<name>``) and at each dose of the dose sweep: what the report says of
                   it there (where it is expected to fall behind); "": not the reference.
    requires:      the optional package it imports, checked before any work; None: none.
    runner:        its per-sample map from the CBED stack; None for the network (the model's
                   prediction) and the mean image (computed once from the training split).
    settings:      what its cached maps depend on (the cache digest); None: not cached.
    subset:        None (every sample) or the rule picking the samples it runs on.
    quick:         ``cfg`` with it switched on at the cheapest settings that still run it whole (the
                   tests' every-method evaluation); None: ``cfg`` already runs it (on by default).
    fit_convention: metrics.json's description of ``<name>_fit`` (legacy-fitted methods).
    missing_note:  why a table may lack it, said under the table when it does (``{why}``: the reason
                   metrics.json's ``absent_baselines`` records for it, else "not computed").
    """

    name: str
    label: str
    short_label: str
    verdict_label: str
    description: str
    colour: str
    targets: tuple[str, ...]
    legacy_fitted: bool
    judged: bool
    dose_sweep: bool
    panel_order: int
    switch: str | None = None
    timing: str = ""
    reference: str = ""
    requires: Requirement | None = None
    runner: Runner | None = None
    settings: Callable[[EvaluationConfig], Any] | None = None
    subset: Callable[[EvaluationConfig], Subset] | None = None
    quick: Callable[[EvaluationConfig], EvaluationConfig] | None = None
    fit_convention: str = ""
    missing_note: str = ""

    @property
    def timed(self) -> bool:
        """Its compute time per sample is recorded and reported."""
        return bool(self.timing)

    @property
    def is_reference(self) -> bool:
        """The network is compared with it sample by sample and at each dose (`Method.reference`)."""
        return bool(self.reference)

    @property
    def figure_label(self) -> str:
        """Its legend and panel title: a reconstruction's short name (its label names the solver)."""
        return self.short_label if self.runner is not None else self.label

    def enabled(self, cfg: EvaluationConfig) -> bool:
        """Whether ``cfg`` asks for it: its switch is on (True, or settings rather than None)."""
        if self.switch is None:
            return True
        value = getattr(cfg, self.switch)
        return value is not None and value is not False

    def off(self) -> str:
        """How a YAML config turns it off ("evaluation.ptycho: false", "evaluation.multislice_ptycho: null")."""
        default = EvaluationConfig.model_fields[self.switch].default if self.switch else None
        return f"evaluation.{self.switch}: {'false' if isinstance(default, bool) else 'null'}"

    def check_requirement(self) -> None:
        """Import what it requires, or raise a one-line `RequirementError` naming the package, how to
        install it and how to turn the method off."""
        if self.requires is None:
            return
        try:
            importlib.import_module(self.requires.module)
        except ImportError as exc:
            raise RequirementError(f"evaluation.{self.switch} ({self.name}) needs {self.requires.package} ({exc}); "
                                   f"{self.requires.install}, or set {self.off()}") from None

    def compute(self, cfg: EvaluationConfig, sample: Any, shape: tuple[int, ...], network: dict[str, np.ndarray],
                subset: Subset | None = None) -> tuple[np.ndarray, dict[str, Any], float]:
        """(map in physical units on a ``shape`` grid, facts, seconds) of one sample, through
        ``cfg.baseline_cache`` when the method is cached (a model-independent method only); ``network``:
        the network's maps of this sample, for a method that starts from them. The seconds are the
        runner's own (an iterative solver's, or the original ones of a cached map) when its facts record
        them, else the wall time of this call."""
        if self.runner is None:
            raise TypeError(f"{self.name} has no per-sample runner (its maps come from the model or the training "
                            "split)")
        started = time.perf_counter()
        shape = tuple(int(n) for n in shape)
        if self.settings is None:
            result, facts = self.runner(cfg, sample, shape, network)
        else:
            result, facts = cached(cfg.baseline_cache, self.name, sample.id, self.settings(cfg),
                                   lambda: self.runner(cfg, sample, shape, network))
        seconds = facts.get("seconds", time.perf_counter() - started)
        # Marked: a subset method's aggregates cover only the samples it ran on.
        return result, ({**facts, "subset": subset.note()} if subset is not None else facts), seconds
