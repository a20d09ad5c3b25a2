"""Starting a run from a trained reconstructor's weights (``training.init_from``): fine-tuning.

A shipped or trained model (``pretrained:NAME``, a model folder, a run folder) continues training on
new data. Its weights were fitted to its own standardisation, so the run takes that model's
normaliser as well: the new data's statistics would shift every input and target the weights
expect. The architecture the config resolves to and its targets must be the model's, field by field.

The exported card's chain (``training.lineage``) continues the model's: its card's chain, or for a
card written before chains existed, one link made of what that card records (`initial_lineage`); its
``training_statistics`` join the model's (`models.card_writer.training_statistics`).
"""
from __future__ import annotations

from collections.abc import Sequence

from .. import checkpoint as ckpt
from ..card import ModelCard
from ..card_training import MAX_LINEAGE, InitialModelFacts, LineageLink
from ..config import Architecture
from .errors import TrainingError
from .run_state import differences


class InitialModel:
    """The model a run starts from: ``state`` (its weights, on the CPU), ``normalizer``
    (`stage.Normalizer`), ``facts`` (what the exported card records of it) and ``card`` (its card)."""

    def __init__(self, source: str, arch: Architecture, targets: Sequence[str], transform: str):
        from models.reconstructor import load_reconstructor

        initial = load_reconstructor(source, device="cpu")
        # what a resume checks of its checkpoint (RunState.restore): the same network and output channels
        theirs = {"architecture": initial.model.arch.to_dict(), "targets": list(initial.card.targets)}
        diff = differences(theirs, {"architecture": arch.to_dict(), "targets": list(targets)})
        if diff:
            raise TrainingError(f"training.init_from={source} is another model than the config's (differs in: "
                                f"{', '.join(diff[:6])}); set the model section to the model's (its card's "
                                f"model_config and targets) or drop init_from")
        if initial.normalizer.transform != transform:
            raise TrainingError(f"training.init_from={source} was trained on {initial.normalizer.transform!r}-compressed "
                                f"patterns but data.transform is {transform!r}; set data.transform: "
                                f"{initial.normalizer.transform}")
        self.state = initial.model.state_dict()
        self.normalizer = initial.normalizer
        card = initial.card
        lineage = initial_lineage(card)
        if len(lineage) >= MAX_LINEAGE:
            raise TrainingError(f"training.init_from={source} already ends a chain of {len(lineage)} runs, the most a "
                                f"card holds ({MAX_LINEAGE}); start a new chain from scratch (drop init_from)")
        #: what the exported card records of the model the run started from (``training.initialized_from``)
        self.facts = InitialModelFacts(model=source, name=card.name,
                                       weights_xxh3_128=card.files[ckpt.MODEL_FILE].xxh3_128,
                                       steps=card.training.steps if card.training else None,
                                       device=card.training.device if card.training else None)
        #: its chain of runs, which the exported card's ``training.lineage`` continues
        self.lineage = lineage
        #: its card, whose ``training_statistics`` the exported card's join (`models.card_writer.training_statistics`)
        self.card = card


def initial_lineage(card: ModelCard) -> list[LineageLink]:
    """The chain of the model ``card`` describes: its ``training.lineage`` (the last link named as the
    card is, when the run's export had no name yet and `namsa publish` named it), or for a card without
    one a single link of its weights, ``data.train_samples`` and ``training`` facts, date unknown."""
    training = card.training
    if training is not None and training.lineage:
        *before, last = training.lineage
        named = last.name is None and card.name is not None
        return [*before, last.model_copy(update={"name": card.name}) if named else last]
    return [LineageLink(name=card.name, weights_xxh3_128=card.files[ckpt.MODEL_FILE].xxh3_128,
                        train_samples=card.data.train_samples if card.data else None,
                        steps=training.steps if training else None,
                        samples_seen=training.samples_seen if training else None,
                        device=training.device if training else None,
                        wall_s=training.wall_s if training else None)]


__all__ = ["InitialModel", "initial_lineage"]
