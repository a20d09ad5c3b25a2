"""What a reconstructor expects: the physics and sampling it was trained on, from its card or stores."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from namsa.errors import UserError
from namsa.optics import scan_step_A
from namsa.sampling import accepted
from stage.microscope.errors import ExperimentalInputError

from ..card import ModelCard


@dataclass
class ModelExpectation:
    """The physics and sampling a reconstructor was trained on.

    ``dk_inv_A`` / ``step_A``: the (smallest, largest) detector pixel (1/Angstrom) and scan step
    (Angstrom) its training data spanned; a file inside their accepted ranges (`dk_range_inv_A`,
    `step_range_A`: namsa.sampling.accepted) is used as is, else it is resampled.
    """

    energy_kv: float
    semiangle_mrad: float
    scan_shape: tuple[int, int]
    pattern_px: int
    target_px: int
    dk_inv_A: tuple[float, float]
    step_A: tuple[float, float]
    source: str

    @property
    def dk_range_inv_A(self) -> tuple[float, float]:
        """Detector pixels (1/Angstrom) used without resampling."""
        return accepted(self.dk_inv_A)

    @property
    def step_range_A(self) -> tuple[float, float]:
        """Scan steps (Angstrom) used without resampling."""
        return accepted(self.step_A)


def model_expectation(card: ModelCard) -> ModelExpectation:
    """The physics a reconstructor was trained on, from its card.

    A published model (``pretrained:<name>``) states its simulation config in ``expects_input``; its
    sampling is `namsa.sampling.config_sampling` of it (the card computes it once, `ExpectsInput.sampling`).
    A model fresh from `namsa train` has no such section: the spans are read from the samples of its
    training stores instead.
    """
    if card.expects_input is not None:
        s = card.expects_input.sampling
        return ModelExpectation(energy_kv=s.energy_kv, semiangle_mrad=s.semiangle_mrad, scan_shape=s.scan_shape,
                                pattern_px=s.pattern_px, target_px=s.target_px, dk_inv_A=s.dk_inv_A, step_A=s.step_A,
                                source="model card expects_input")
    if card.data is not None and card.data.dirs:
        return _from_stores(card.data.dirs)
    raise ExperimentalInputError("the model's card says neither what input it expects (expects_input) nor where its "
                                 "training data is; publish it with namsa publish RUN NAME --out DIR")


def _from_stores(dirs: Sequence[str], limit: int = 64) -> ModelExpectation:
    """Spans of the training samples' sampling (the first ``limit`` samples of the first store), as
    their meta records it (namsa.sampling: pattern_dk_inv_A, and the step of fov_A over scan_shape)."""
    import stage

    try:
        with stage.open_store(dirs[0]) as store:
            samples = [store[i] for i in range(min(limit, len(store)))]
    except UserError as exc:
        raise ExperimentalInputError(f"the model's card names no expects_input and its training data cannot be read "
                                     f"({exc}); publish it with namsa publish RUN NAME --out DIR") from None
    first = samples[0]
    dks = [float(s.meta["pattern_dk_inv_A"]) for s in samples]
    steps = [step for s in samples for step in scan_step_A(s.meta["fov_A"], s.meta["scan_shape"])]
    sy, sx = (int(v) for v in first.meta["scan_shape"])
    return ModelExpectation(energy_kv=float(first.meta["energy_kv"]),
                            semiangle_mrad=float(first.meta["semiangle_mrad"]), scan_shape=(sy, sx),
                            pattern_px=int(first.cbed.shape[-1]), target_px=int(first.potential.shape[0]),
                            dk_inv_A=(min(dks), max(dks)), step_A=(min(steps), max(steps)),
                            source=f"training store {dirs[0]}")
