"""Building and writing a model card: the one builder from a checkpoint state and the one writer.

`card_from_state` is how every card starts (the trainer's export, the card `load_reconstructor` makes
for a checkpoint directory); `write_card` is how every card reaches disk (the trainer's export,
`workflow.pretrained`): validated first, then written whole through `stage.jsonfile.write_json_atomic`
(a temporary file in the same folder, fsync, os.replace), so a reader, or a write that is killed or
fails half-way, sees the old card or the new one, never a part.

A card built from a run that names its training stores (``data.dirs``) records the ranges of the
input's cheap statistics over their training split (``training_statistics``: defocus, scattering,
dose; `stage.scan_statistics`), which `Reconstructor.predict`'s input report compares each input with.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from namsa.errors import NamsaError
from stage.jsonfile import write_json_atomic

from .card import CARD_FILE, MODEL_FILE, ModelCard, validate_card

#: the checkpoint state's entries a card copies as they are
STATE_FIELDS = ("model_config", "architecture", "targets", "normalizer", "data_manifest_hash", "code_version",
                "train_config")


def card_from_state(state: Mapping[str, Any], where: str, **fields: Any) -> ModelCard:
    """A validated card from a verified checkpoint ``state`` (`models.checkpoint.verify_checkpoint`):
    its `STATE_FIELDS`, format and weights entry, then ``fields`` (which win), and the training
    statistics of the stores ``fields["data"]["dirs"]`` names (`training_statistics`) unless given;
    one-line `models.card.ModelDirError` naming ``where`` when the result is not a card."""
    card: dict[str, Any] = {k: state[k] for k in STATE_FIELDS if k in state}
    card.update(format="namsa-reconstructor", format_version=state.get("format_version"),
                files={MODEL_FILE: (state.get("files") or {}).get(MODEL_FILE)})
    card.update(fields)
    if "training_statistics" not in card:
        statistics = training_statistics(card.get("data"))
        if statistics is not None:
            card["training_statistics"] = statistics
    return validate_card(card, where)


def training_statistics(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The card's ``training_statistics`` (`models.card.TrainingStatistics`): the range of each cheap
    statistic of the input over the training split of the stores ``data["dirs"]`` names
    (`stage.scan_statistics.split_ranges`); None without stores, with no training sample, or when
    the stores cannot be read (the card is still written: its input report then says what it lacks)."""
    dirs = (data or {}).get("dirs")
    if not dirs:
        return None
    from stage.scan_statistics import split_ranges

    try:
        return split_ranges(dirs, "train")
    except NamsaError:  # a store gone or damaged since training: the weights are still worth a card
        return None


def write_card(folder: str | Path, card: ModelCard) -> Path:
    """Write ``card`` as ``folder/model_card.json`` atomically (see the module docstring); returns the path."""
    path = Path(folder) / CARD_FILE
    write_json_atomic(path, card.to_json(), sort_keys=True)
    return path


__all__ = ["card_from_state", "training_statistics", "write_card", "STATE_FIELDS"]
