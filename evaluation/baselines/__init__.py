"""The baselines every network number is shown against, each a map in its own physical units.

* **mean**: the pixel-wise mean of the training targets (physical units). A network that does not
  beat it has learned nothing about the individual sample.
* **icom**: integrated centre of mass from the same 4D stack (`namsa.icom`), calibrated by the
  detector sampling: a projected potential in V*Angstrom. Potential only.
* **ptycho**: single-slice ptychography of the same stack through py4DSTEM
  (`namsa.ptychography.single_slice`): the iterative phase retrieval microscopists use. Its phase over
  the interaction constant is a projected potential (V*Angstrom), brought to the targets' resolution.
  It iterates until py4DSTEM's own data error stops falling (`namsa.ptychography.convergence`),
  never judged on the truth. Potential only; optional (``evaluation.ptycho``).
* **multislice_ptycho**: multislice ptychography through py4DSTEM (`namsa.ptychography.multislice`),
  slices from the sample's thickness, the slices' phases summed and over sigma. Expensive, so run on a
  subset of thick samples (``evaluation.multislice_ptycho``) and scored only on those.

No map here reads the truth (`maps`). How they are scored is `evaluation.views`': under the headline
(the field's rule) every method's map, the network's included, keeps its own units and only its mean
is set to the truth's (a uniform phase changes no intensity); the structure view fits one scale and
offset to the truth for every method (`fitted.fit_to_truth`), and the legacy rule, kept for
comparison, fitted them to the reconstruction baselines only.
"""
from __future__ import annotations

from .fitted import fit_to_truth
from .icom import ICoMInputError, icom_from_sample, icom_reconstruct
from .maps import icom_baseline, multislice_baseline, ptycho_baseline
from .mean import mean_training_targets

__all__ = ["mean_training_targets", "fit_to_truth", "icom_baseline", "ptycho_baseline", "multislice_baseline",
           "icom_reconstruct", "icom_from_sample", "ICoMInputError"]
