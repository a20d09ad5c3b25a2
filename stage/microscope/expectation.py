"""What a reconstructor expects: the physics and sampling it was trained on, from its card or stores."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from namsa.errors import UserError

from .errors import ExperimentalInputError


@dataclass
class ModelExpectation:
    """The physics and sampling a reconstructor was trained on.

    ``dk_range_inv_A`` / ``step_range_A``: the detector pixel (1/Angstrom) and scan step (Angstrom)
    its training data spanned; a file inside both is used as is, else it is resampled.
    """

    energy_kv: float
    semiangle_mrad: float
    scan_shape: tuple[int, int]
    pattern_px: int
    target_px: int
    dk_range_inv_A: tuple[float, float]
    step_range_A: tuple[float, float]
    source: str


def model_expectation(card: Mapping[str, Any]) -> ModelExpectation:
    """The physics a reconstructor was trained on, from its card.

    A published model (``pretrained:<name>``) states it in ``expects_input`` (the simulation
    config): the supercell is the smallest whole number of unit cells at least ``cell_lateral_A``
    wide and the grid the smallest 2,3-smooth pixel count at least as fine as ``sampling_A``, so
    the training scan steps spanned [cell_lateral_A, 2 cell_lateral_A) / scan and the detector
    pixels [1, 4/3) x band_limit / (sampling_A * pattern_px). A model fresh from `namsa train`
    has no such section: the range is read from the samples of its training stores instead.
    """
    expects = card.get("expects_input")
    if expects:
        return _from_expects(expects)
    dirs = (card.get("data") or {}).get("dirs")
    if dirs:
        return _from_stores(dirs)
    raise ExperimentalInputError("the model's card says neither what input it expects (expects_input) nor where its "
                                 "training data is; publish it with python -m workflow.pretrained RUN NAME")


def _from_expects(e: Mapping[str, Any]) -> ModelExpectation:
    sy, sx = (int(v) for v in e["scan_shape"])
    dk = float(e["band_limit"]) / (float(e["sampling_A"]) * int(e["pattern_px"]))
    step = float(e["cell_lateral_A"]) / max(sy, sx)
    return ModelExpectation(energy_kv=float(e["energy_kv"]), semiangle_mrad=float(e["semiangle_mrad"]),
                            scan_shape=(sy, sx), pattern_px=int(e["pattern_px"]), target_px=int(e["target_px"]),
                            dk_range_inv_A=(0.98 * dk, 1.34 * dk), step_range_A=(0.98 * step, 2.0 * step),
                            source="model card expects_input")


def _from_stores(dirs: Sequence[str], limit: int = 64) -> ModelExpectation:
    """Range of the training samples' sampling (the first ``limit`` samples of the first store, 2% slack)."""
    import stage

    try:
        with stage.open_store(dirs[0]) as store:
            samples = [store[i] for i in range(min(limit, len(store)))]
    except UserError as exc:
        raise ExperimentalInputError(f"the model's card names no expects_input and its training data cannot be read "
                                     f"({exc}); publish it with python -m workflow.pretrained RUN NAME") from None
    first = samples[0]
    dks = [float(s.meta["pattern_dk_inv_A"]) for s in samples]
    steps = [float(s.meta["fov_A"][k + 2]) / int(s.meta["scan_shape"][k]) for s in samples for k in (0, 1)]
    sy, sx = (int(v) for v in first.meta["scan_shape"])
    return ModelExpectation(energy_kv=float(first.meta["energy_kv"]),
                            semiangle_mrad=float(first.meta["semiangle_mrad"]), scan_shape=(sy, sx),
                            pattern_px=int(first.cbed.shape[-1]), target_px=int(first.potential.shape[0]),
                            dk_range_inv_A=(0.98 * min(dks), 1.02 * max(dks)),
                            step_range_A=(0.98 * min(steps), 1.02 * max(steps)), source=f"training store {dirs[0]}")

