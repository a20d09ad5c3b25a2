"""The baselines every network number is shown against.

* **mean**: the pixel-wise mean of the training targets (physical units). A network that does not
  beat it has learned nothing about the individual sample.
* **icom**: integrated centre of mass from the same 4D stack (`evaluation.baselines.icom`), which
  recovers the projected potential of thin weak-phase specimens up to scale and offset. It is put into the
  truth's units by a per-sample least-squares fit of ``scale * icom + offset`` to the truth, with
  ``scale >= 0`` (a map that would need a sign flip gets scale 0, the best constant; the signed
  scale is recorded beside the fit). **This uses the truth, for these two scalars only**; the map
  itself comes from the CBED stack alone. The fit favours the baseline, so the comparison is
  conservative for the network.
  iCoM estimates the potential, so it is a baseline for ``potential`` only.
* **ptycho**: single-slice ptychography of the same stack through py4DSTEM
  (`namsa.ptychography.single_slice`): the iterative phase retrieval microscopists use. Its phase over
  the interaction constant is a projected potential; it is put into the truth's units by the same
  per-sample least-squares fit as iCoM (**uses the truth for two scalars**), for the same reason:
  the reconstruction's scale drifts with the iteration count and its mean is undetermined.
  It iterates until py4DSTEM's own data error stops falling (`namsa.ptychography.convergence`),
  never judged on the truth. Potential only; optional (``evaluation.ptycho``).
* **multislice_ptycho**: multislice ptychography through py4DSTEM
  (`namsa.ptychography.multislice`), slices from the sample's thickness, the slices' phases
  summed and over sigma; fitted the same way. Expensive, so run on a subset of thick samples
  (``evaluation.multislice_ptycho``) and scored only on those.
"""
from __future__ import annotations

from .fitted import fit_to_truth, icom_baseline, multislice_baseline, ptycho_baseline
from .icom import ICoMInputError, icom_from_sample, icom_reconstruct
from .mean import mean_training_targets

__all__ = ["mean_training_targets", "fit_to_truth", "icom_baseline", "ptycho_baseline", "multislice_baseline",
           "icom_reconstruct", "icom_from_sample", "ICoMInputError"]
