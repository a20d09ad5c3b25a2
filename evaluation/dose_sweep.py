"""Scores at fixed electron doses: the network and the baselines on the same shot-noised stacks.

A microscope's scan carries counts, not the noise-free intensities the simulator writes. For each
dose of ``evaluation.doses`` (electrons / Angstrom^2) every evaluated sample's patterns are replaced
by Poisson counts at that dose (`stage.dose.add_shot_noise`, the loader's own noise model) drawn
from a stream fixed by (seed, dose, sample id), so the network and the swept baselines are scored
on the very same noisy data, and a rerun draws the same noise. The methods whose record says
``dose_sweep=False`` (`evaluation.methods`: the ptychographies, seconds to minutes per sample and
dose) are left out here; the verdict at each dose is the same rule as the
headline's (`verdict.all_verdicts`: material-level intervals, per element class).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from stage.dose import add_shot_noise, augmentation_rng

from .aggregation import aggregate, class_aggregates, headline_of
from .config import EvaluationConfig
from .methods import REGISTRY, reference
from .scoring import score_all
from .verdict import all_verdicts
from .views import HEADLINE, headline_scores


class NoisyStores:
    """The evaluated stores with each sample's patterns as Poisson counts at ``dose`` (e/A^2),
    normalised back so the incident probe carries 1 on average (the model's convention)."""

    def __init__(self, stores: Any, dose: float, seed: int):
        self.stores, self.dose, self.seed = stores, float(dose), int(seed)

    def __getitem__(self, index: int) -> Any:
        sample = self.stores[index]
        cbed = np.array(sample.cbed, dtype=np.float32)
        # the dose in the stream's key: each dose gets its own draw, the same one for every method
        rng = augmentation_rng(self.seed, int(round(self.dose)), sample.id)
        add_shot_noise(cbed, self.dose * sample.meta.scan_step_area_A2, rng)
        return dataclasses.replace(sample, cbed=cbed, meta=sample.meta.replace(dose_e_per_A2=self.dose))


def dose_sweep(cfg: EvaluationConfig, stores: Any, indices: list[int], rec: Any, targets: list[str],
               mean_maps: dict[str, np.ndarray] | None, absent: dict[str, str]) -> list[dict[str, Any]]:
    """One entry per dose of ``cfg.doses``: {dose_e_per_A2, n_samples, headline[target][method][view][metric]
    (`aggregation.headline_of`: mean over samples in every view), aggregates, verdicts (as the headline's)}."""
    quiet = cfg.model_copy(update={"n_panels": 0})
    swept = tuple(m for m in REGISTRY if m.dose_sweep)   # costly reconstructions are left out
    sweep = []
    for dose in cfg.doses:
        records, _ = score_all(quiet, NoisyStores(stores, dose, cfg.seed), indices, rec, targets, mean_maps, swept)
        aggregates = {t: aggregate(records, t, quiet) for t in targets}
        by_class = {t: class_aggregates(records, t, quiet) for t in targets}
        verdicts = all_verdicts(aggregates, intervals=cfg.n_bootstrap > 0, ci_level=cfg.ci_level,
                                by_class=by_class, absent=absent)
        headline = headline_of(aggregates)
        sweep.append({"dose_e_per_A2": float(dose), "n_samples": len(records), "headline": headline,
                      "aggregates": aggregates, "verdicts": verdicts})
    return sweep


def dose_lines(sweep: list[dict[str, Any]], target: str = "potential") -> list[str]:
    """One printed line per dose: each method's relative L2 under the field's rule (an old summary's:
    the legacy rule, said so) and the verdict against the reference method (`methods.reference`: iCoM)."""
    lines = []
    for entry in sweep:
        view, scores = headline_scores(entry["headline"].get(target, {}))
        errors = {m: v.get("rel_l2") for m, v in scores.items()}
        text = ", ".join(f"{m} {e:.3f}" for m, e in errors.items() if e is not None)
        rule = "field's rule" if view == HEADLINE else "legacy rule"
        verdict = entry["verdicts"].get(target, {}).get(reference().name, {}).get("overall_sentence", "")
        lines.append(f"  at {entry['dose_e_per_A2']:g} e/A^2 ({target} rel. L2, {rule}): {text}"
                     + (f"; {verdict}" if verdict else ""))
    return lines
