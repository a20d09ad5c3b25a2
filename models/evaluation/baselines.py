"""The baselines every network number is shown against.

* **mean**: the pixel-wise mean of the training targets (physical units). A network that does not
  beat it has learned nothing about the individual sample.
* **icom**: integrated centre of mass from the same 4D stack (`namsa.icom`), which recovers the
  projected potential of thin weak-phase specimens up to scale and offset. It is put into the
  truth's units by a per-sample least-squares fit of ``scale * icom + offset`` to the truth.
  **This uses the truth, for these two scalars only**; the map itself comes from the CBED stack
  alone. The fit favours the baseline, so the comparison is conservative for the network.
  iCoM estimates the potential, so it is a baseline for ``potential`` only.
* **ptycho**: single-slice ptychography of the same stack through py4DSTEM
  (`models.evaluation.ptycho`): the iterative phase retrieval microscopists use. Its phase over
  the interaction constant is a projected potential; it is put into the truth's units by the same
  per-sample least-squares fit as iCoM (**uses the truth for two scalars**), for the same reason:
  the reconstruction's scale drifts with the iteration count and its mean is undetermined.
  Potential only; optional (``evaluation.ptycho``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from models.metrics import fit_affine
from namsa.errors import UserError
from namsa.icom import icom_from_sample


class BaselineError(UserError):
    """A baseline cannot be computed from the data given."""


def mean_training_targets(stores: Any, targets: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Pixel-wise mean of each target over the train split of ``stores`` (a `stage.StoreSet`).

    Reads only the target arrays (not the CBED stacks). None when the stores hold no training
    samples (e.g. a test-only store): the mean baseline is then left out and the report says so.
    """
    indices = stores.indices("train")
    if not indices:
        return None
    sums: dict[str, np.ndarray] = {}
    for i in indices:
        reader, j = stores.locate(i)
        arrays, _ = reader.read_arrays(j, names=tuple(targets))
        for name in targets:
            sums[name] = sums.get(name, 0.0) + arrays[name].astype(np.float64)
    return {name: (total / len(indices)).astype(np.float32) for name, total in sums.items()}


def icom_baseline(sample: Any, truth: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """iCoM of ``sample`` on the truth's grid, least-squares scaled and offset to ``truth``.

    Returns the fitted map (units of the truth) and ``{"scale", "offset"}`` of the fit.
    """
    raw = icom_from_sample(sample, output_shape=truth.shape)
    scale, offset = fit_affine(raw, truth)
    return (scale * raw + offset).astype(np.float32), {"scale": scale, "offset": offset}


def ptycho_baseline(sample: Any, truth: np.ndarray, iterations: int,
                    batch_size: int) -> tuple[np.ndarray, dict[str, float]]:
    """Ptychography of ``sample`` on the truth's grid, least-squares scaled and offset to ``truth``.

    Returns the fitted map (units of the truth) and ``{"scale", "offset", "seconds", "error"}``:
    the fit, py4DSTEM's compute time for this sample (s) and its final data error.
    """
    from .ptycho import ptycho_from_sample

    result = ptycho_from_sample(sample, output_shape=truth.shape, iterations=iterations, batch_size=batch_size)
    scale, offset = fit_affine(result.potential, truth)
    fitted = (scale * result.potential.astype(np.float64) + offset).astype(np.float32)
    return fitted, {"scale": scale, "offset": offset, "seconds": result.seconds, "error": result.error}
