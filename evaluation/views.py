"""The views every method's map is scored in (docs/evaluation.md, "How methods are scored: the field's rule").

A uniform phase changes no diffraction intensity, so no method can read a map's mean from the data;
the field compares phase reconstructions after removing that constant. Every method, the network
included, hands in its map in its own physical units (V*Angstrom for the potential, electrons /
Angstrom^2 for the density; maps are [row = y, col = x]) and is scored in:

* ``field`` (the headline, what the verdict is decided on): the map with only its mean replaced by
  the truth's, ``est - mean(est) + mean(truth)``; nothing else is taken from the truth.
* ``structure``: one least-squares scale (>= 0) and offset fitted to the truth for every method
  (`baselines.fitted.fit_to_truth`): structure only, two numbers from the truth per map.
* `LEGACY` (the rule before issue 30, kept so old figures can be compared): the network and the
  mean image as they are, each reconstruction baseline least-squares scaled and offset to the truth.

Beside them the network's own **level error** ``|mean(pred) - mean(truth)| / |mean(truth)|``
(`LEVEL`): what the field view hands every method, reported with no verdict (no baseline estimates it).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .baselines.fitted import fit_to_truth

FIELD = "field"
STRUCTURE = "structure"
LEGACY = "legacy_network_as_predicted_baselines_fitted"
#: the view the verdict, the headline tables, the closing lines and the cards' headline read.
HEADLINE = FIELD
#: every view a method is scored in, in the order the report shows them.
VIEWS: tuple[str, ...] = (FIELD, STRUCTURE, LEGACY)
#: the network's own entry beside the views: {"level_error": float}.
LEVEL = "level"
#: the key of the shipped cards' and old metrics.json's scores: the legacy rule under another name.
OLD_PHYSICAL = "physical"

#: how the report and the closing lines name each view.
VIEW_TITLES: dict[str, str] = {
    FIELD: "the field's rule (each map in its own physical units, only its mean set to the truth's)",
    STRUCTURE: "structure only (one least-squares scale and offset fitted to the truth for every method)",
    LEGACY: "legacy rule (network as predicted, baselines least-squares scaled and offset to the truth)",
}


def field_map(est: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``est`` with its mean replaced by the truth's (same units as both), float64."""
    est = np.asarray(est, dtype=np.float64)
    return est - est.mean() + float(np.mean(np.asarray(truth, dtype=np.float64)))


def level_error(pred: np.ndarray, truth: np.ndarray) -> float:
    """``|mean(pred) - mean(truth)| / |mean(truth)|`` (dimensionless): how far a map's mean is off;
    ``inf`` for a truth of mean 0 unless the means agree (then 0)."""
    true_mean = float(np.mean(np.asarray(truth, dtype=np.float64)))
    gap = abs(float(np.mean(np.asarray(pred, dtype=np.float64))) - true_mean)
    if true_mean == 0.0:
        return 0.0 if gap == 0.0 else math.inf
    return gap / abs(true_mean)


def view_maps(est: np.ndarray, truth: np.ndarray, legacy_fitted: bool
              ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """({view: the map scored in it}, the structure view's fit {"scale", "offset", "signed_scale"}).

    legacy_fitted: the legacy rule scaled and offset this method's map (`methods.Method.legacy_fitted`);
    its legacy map is then the structure view's map (the same object), else the map as it is.
    """
    est = np.asarray(est, dtype=np.float64)
    structure, fit = fit_to_truth(est, truth)
    return {FIELD: field_map(est, truth), STRUCTURE: structure, LEGACY: structure if legacy_fitted else est}, fit


def legacy_scores(entry: dict[str, Any]) -> dict[str, Any]:
    """One method's legacy-rule scores (aggregate, headline or per-sample entry), new file or old: its
    `LEGACY` view, the same scores under `OLD_PHYSICAL` in files written before issue 30, or a flat old
    headline entry itself."""
    return entry.get(LEGACY) or entry.get(OLD_PHYSICAL) or entry


def headline_scores(per_method: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(view, {method: its scores in that view}) of one target's aggregates or headline, new or old.

    The field view where the entries hold it. Else the scores were written before issue 30 (a shipped
    card, an old metrics.json or eval-summary.json): under ``physical``, or flat ({method: {metric:
    value}}, an old headline); both are the legacy rule's, and are returned under `LEGACY`.
    """
    if any(isinstance(v, dict) and HEADLINE in v for v in per_method.values()):
        return HEADLINE, {m: v[HEADLINE] for m, v in per_method.items() if HEADLINE in v}
    if any(isinstance(v, dict) and OLD_PHYSICAL in v for v in per_method.values()):
        return LEGACY, {m: v[OLD_PHYSICAL] for m, v in per_method.items() if OLD_PHYSICAL in v}
    return LEGACY, dict(per_method)
