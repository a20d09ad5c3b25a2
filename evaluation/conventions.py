"""metrics.json's ``conventions``: what each of its names means. The units, the views and the rules are
said here once; every metric's definition comes from its record (`metric_registry`), every legacy-fitted
method's ``<name>_fit`` and every timed method's compute seconds from its record (`methods.REGISTRY`),
so a new method or metric is described where it is declared."""
from __future__ import annotations

from .methods import REGISTRY
from .metric_registry import METRICS, judged
from .views import FIELD, LEGACY, LEVEL, STRUCTURE

_VIEWS = {
    "physical_units": {"potential": "V*Angstrom (projected potential)",
                       "density": "electrons/Angstrom^2 (projected electron density)"},
    FIELD: ("the headline and the verdict's view (the field's rule): every method's map, the network's "
            "included, in its own physical units with only its mean replaced by the truth's, est - mean(est) + "
            "mean(true). A uniform phase changes no diffraction intensity, so no method can read a map's mean "
            "from the data; nothing else is taken from the truth"),
    STRUCTURE: ("structure only: for every method, the network included, one least-squares scale (>= 0) and "
                "offset fitted to the truth per sample (two numbers from the truth); scale is that fit's scale "
                "(1: the map was in the truth's units already)"),
    LEGACY: ("the rule before issue 30, kept for comparison: the network and the mean image as they are, "
             + ", ".join(m.name for m in REGISTRY if m.legacy_fitted)
             + " least-squares scaled and offset to the truth per sample (<method>_fit)"),
    LEVEL: ("the network's level error |mean(pred) - mean(true)| / |mean(true)| (median and mean over samples): "
            "what the field view hands every method; no baseline estimates it, so it has no verdict"),
}

#: how every legacy fit record (``<name>_fit``) reads, after the method's own sentence.
_LEGACY_FIT = ("scale, offset: the legacy rule's least-squares fit of the map to the truth per sample, "
               "with scale >= 0 (a map that would need a negative scale gets scale 0: the best constant); "
               "signed_scale: the unconstrained scale (negative: the map was anti-correlated with the truth). "
               "The same fit makes its structure view; its headline (field) view uses none of it")

_RULES = {
    "ci": "percentile bootstrap of the mean over materials: materials resampled with replacement, each "
          "bringing all of its samples (a material's samples are not independent); fewer than 2 materials "
          "give no interval",
    "verdict": "the network 'beats' a baseline only when it is better on every headline metric ("
               + ", ".join(m.name for m in judged()) + "; field view) with non-overlapping material-level bootstrap "
               "intervals; decided overall and per element class (light: every element Z <= 14; heavy: the "
               "rest), and a class where it is not met says 'loses to', 'ties with' or 'does NOT beat'",
    "compute_seconds": "seconds per sample in this process, each without the one-off import of what it requires: "
                       + "; ".join(f"{m.name} = {m.timing}" for m in REGISTRY if m.timed),
    "network_resolution": "a model trained on the hard-cutoff targets of before 2026-11-24 (card code_version "
                          "without +targets2) is compared at the targets' stated resolution (target_fwhm_A, "
                          "namsa.targets.to_target_resolution), as ptychography is; a current model as it predicts",
    "dose_sweep": "with evaluation.doses: every sample scored again on Poisson counts at each dose (electrons/"
                  "Angstrom^2 per probe position's area), the same draw for every method; left out: "
                  + ", ".join(m.name for m in REGISTRY if not m.dose_sweep),
    "mean_baseline": "pixel-wise mean of the training-split targets; absent (absent_baselines says why) when "
                     "the evaluated stores hold no training samples: a mean of the evaluated samples' own "
                     "targets would use the truth it is scored against",
}

#: what metrics.json's names mean: units and views, each metric, each fitted method's ``<name>_fit``, the rules.
CONVENTIONS: dict[str, object] = {
    **_VIEWS,
    **{m.name: m.definition for m in METRICS},
    **{f"{m.name}_fit": f"{m.fit_convention}. {_LEGACY_FIT}" for m in REGISTRY if m.legacy_fitted},
    **_RULES,
}
