"""The evaluation's methods, one record each: the one place that says which methods exist. Each
baseline's record (`baselines.record.Method`: what it is called, how it is drawn, what it produces, how
it is run, what it requires, whether it is the reference) sits beside its runner in its own module of
``evaluation/baselines/``; `REGISTRY` assembles them with the network's. Scoring, aggregation, the
verdict, the report, metrics.json's conventions, the figures, the dose sweep, the baseline precompute,
the scaling study and docs/evaluation.md's method table read `REGISTRY`; none keeps a list of method
names of its own.

Adding a baseline: a module in ``evaluation/baselines/`` with its map function (sample and the targets'
grid shape -> map in physical units and the facts of its computation; it never sees the truth) and its
``METHOD``, then one line below (docs/architecture.md). Scoring puts every map into the views
(`evaluation.views`).
"""
from __future__ import annotations

from typing import Any

from .baselines import icom, mean, multislice, ptycho, refined
from .baselines.record import ALL_TARGETS, Method, Requirement, RequirementError, Runner, Subset
from .config import EvaluationConfig

NETWORK_METHOD = Method(
    name="network", label="network", short_label="network", verdict_label="network",
    description="the trained reconstructor's prediction from the CBED stack, in physical units",
    colour="tab:blue", targets=ALL_TARGETS, legacy_fitted=False, judged=False, dose_sweep=True, panel_order=0,
    timing="Reconstructor.predict of a batch (normalisation included) / batch size")

#: every method, in the tables' order (network first).
REGISTRY: tuple[Method, ...] = (
    NETWORK_METHOD,
    mean.METHOD,
    icom.METHOD,
    ptycho.METHOD,
    multislice.METHOD,
    refined.METHOD,
)

#: the names other modules refer to a method by (a method's name is its metrics.json key); the network
#: and the mean image (computed once from the training split, not per sample) are special cases.
NETWORK, MEAN = NETWORK_METHOD.name, mean.METHOD.name
ICOM, PTYCHO, MULTISLICE_PTYCHO, NETWORK_PTYCHO = (icom.METHOD.name, ptycho.METHOD.name, multislice.METHOD.name,
                                                   refined.METHOD.name)

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


def reference() -> Method:
    """The method the network is compared with sample by sample and at each dose (`Method.reference`)."""
    return next(m for m in REGISTRY if m.is_reference)


def per_sample(cfg: EvaluationConfig, target: str) -> list[Method]:
    """The methods ``cfg`` asks for that compute a map of ``target`` sample by sample from its stack."""
    return [m for m in REGISTRY if m.runner is not None and target in m.targets and m.enabled(cfg)]


def check_requirements(cfg: EvaluationConfig, methods: tuple[Method, ...] = REGISTRY) -> None:
    """Before any work: a `RequirementError` naming the first method ``cfg`` asks for whose required
    package is missing (`Method.check_requirement`)."""
    for m in methods:
        if m.enabled(cfg):
            m.check_requirement()


__all__ = ["ALL_TARGETS", "ICOM", "MEAN", "MULTISLICE_PTYCHO", "NETWORK", "NETWORK_PTYCHO", "PTYCHO", "REGISTRY",
           "Method", "Requirement", "RequirementError", "Runner", "Subset", "baselines", "check_requirements",
           "in_panel_order", "method", "names", "per_sample", "reference"]
