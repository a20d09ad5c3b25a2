"""Starting a run from a trained reconstructor's weights (``training.init_from``): fine-tuning.

A shipped or trained model (``pretrained:NAME``, a model folder, a run folder) continues training on
new data. Its weights were fitted to its own standardisation, so the run takes that model's
normaliser as well: the new data's statistics would shift every input and target the weights
expect. The architecture the config resolves to must be the model's, field by field.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..config import Architecture
from .errors import TrainingError


class InitialModel:
    """The model a run starts from: ``state`` (its weights, on the CPU), ``normalizer``
    (`stage.Normalizer`) and ``facts`` (what the exported card records of it)."""

    def __init__(self, source: str, arch: Architecture, transform: str):
        from models.reconstructor import load_reconstructor

        initial = load_reconstructor(source, device="cpu")
        _check_architecture(source, initial.model.arch, arch)
        if initial.normalizer.transform != transform:
            raise TrainingError(f"training.init_from={source} was trained on {initial.normalizer.transform!r}-compressed "
                                f"patterns but data.transform is {transform!r}; set data.transform: "
                                f"{initial.normalizer.transform}")
        self.state = {k: v.detach().clone() for k, v in initial.model.state_dict().items()}
        self.normalizer = initial.normalizer
        card = initial.card
        training = card.training or {}
        self.facts: dict[str, Any] = {"model": source, "name": card.name,
                                      "weights_xxh3_128": card.files["model.safetensors"].xxh3_128,
                                      "steps": training.get("steps"), "device": training.get("device")}


def _check_architecture(source: str, have: Architecture, want: Architecture) -> None:
    """One line naming the first fields where the model's architecture differs from the config's."""
    theirs, ours = asdict(have), asdict(want)
    differ = [k for k in ours if theirs.get(k) != ours[k]]
    if differ:
        shown = ", ".join(f"{k}: model {theirs.get(k)!r} vs config {ours[k]!r}" for k in differ[:3])
        raise TrainingError(f"training.init_from={source} has another architecture than the config ({shown}); "
                            f"set the model section to the model's (its card's model_config) or drop init_from")


__all__ = ["InitialModel"]
