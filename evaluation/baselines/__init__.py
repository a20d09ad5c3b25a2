"""The baselines every network number is shown against, each a map in its own physical units, one
module per baseline: its map function (sample and the targets' grid shape -> map and the facts of its
computation) beside its record (``METHOD``, a `record.Method`: labels, switch, what it requires, what it
is), which `evaluation.methods.REGISTRY` assembles. What each baseline is, is its record's description
(docs/evaluation.md's method table is rendered from the registry). `maps` holds what the ptychography
baselines share, `cache` the store of model-independent maps, `thick_subset` multislice's subset rule.

No map here reads the truth. How they are scored is `evaluation.views`': under the headline
(the field's rule) every method's map, the network's included, keeps its own units and only its mean
is set to the truth's (a uniform phase changes no intensity); the structure view fits one scale and
offset to the truth for every method (`fitted.fit_to_truth`), and the legacy rule, kept for
comparison, fitted them to the reconstruction baselines only.
"""
from __future__ import annotations

from .fitted import fit_to_truth
from .icom import ICoMInputError, icom_baseline, icom_from_sample, icom_reconstruct
from .mean import mean_training_targets
from .multislice import multislice_baseline
from .ptycho import ptycho_baseline

__all__ = ["mean_training_targets", "fit_to_truth", "icom_baseline", "ptycho_baseline", "multislice_baseline",
           "icom_reconstruct", "icom_from_sample", "ICoMInputError"]
