"""A published reconstructor's ``training_statistics`` measured again from its training data, as the
trainer's export measures them now (`models.card_writer.training_statistics`: every training sample's
cheap statistics, `stage.scan_statistics.split_ranges`; for a fine-tune, the union with the card of the
model it started from, `models.card_statistics.union_statistics`).

    python scripts/card_statistics.py models/pretrained/study-scan-camera runs/camera-study/data

Only that field of the card is replaced; every other is kept as it was (checked after writing,
`workflow.rescore_card.rewrite_card_records`) and the weights are not touched (their digest is checked
by loading the model). Refused in one line: data that are not the card's training data (their
manifests' hash, `models.training.data.manifest_hash`, against the card's ``data_manifest_hash``), and a
fine-tune whose initial model's weights are not the ones its card names (``training.initialized_from``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from models import checkpoint as ckpt
from models.card import CARD_FILE, DataInfo, ModelCard, read_card_file
from models.card_writer import training_statistics
from models.reconstructor import load_reconstructor
from models.training.data import manifest_hash
from namsa.errors import UserError

from .rescore_card import rewrite_card_records


def restate_training_statistics(folder: str | Path, data_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Replace the ``training_statistics`` of the card in ``folder`` with those of its training data at
    ``data_dirs`` (joined with its initial model's for a fine-tune); returns the new record as JSON."""
    import stage

    folder = Path(folder)
    card = read_card_file(folder / CARD_FILE)
    stores = [p for d in data_dirs for p in stage.find_stores(d)]
    if not stores:
        raise UserError(f"no sample stores under {[str(d) for d in data_dirs]}; pass the model's training data")
    check_training_data(card, stores)
    statistics = training_statistics(DataInfo(dirs=[str(p) for p in stores]), initial_card(card))
    if statistics is None:
        raise UserError(f"{[str(d) for d in data_dirs]} hold no readable training sample; nothing to record")
    rewrite_card_records(folder, {"training_statistics": statistics})
    return statistics


def check_training_data(card: ModelCard, stores: Sequence[Path]) -> None:
    """One-line `UserError` unless ``stores`` are the data ``card`` was trained on (the hash of their
    manifests is the card's ``data_manifest_hash``, as the trainer computed it)."""
    import stage

    if card.data_manifest_hash is None:
        raise UserError("the card records no data_manifest_hash: its training data cannot be recognised")
    with stage.open_stores(list(stores)) as opened:
        found = manifest_hash(opened.manifests)
    if found != card.data_manifest_hash:
        raise UserError(f"the stores {[str(p) for p in stores][:3]} are not the card's training data (manifest hash "
                        f"{found[:12]}..., the card's {card.data_manifest_hash[:12]}...); pass the data it was "
                        f"trained on, in the order it was given")


def initial_card(card: ModelCard) -> ModelCard | None:
    """The card of the model ``card``'s run was fine-tuned from (``training.initialized_from``), None for a
    run from scratch; one-line `UserError` when that model's weights are not the ones ``card`` names."""
    origin = card.training.initialized_from if card.training is not None else None
    if origin is None:
        return None
    parent = load_reconstructor(origin.model, device="cpu").card
    digest = parent.files[ckpt.MODEL_FILE].xxh3_128
    if digest != origin.weights_xxh3_128:
        raise UserError(f"{origin.model} holds weights {digest}, not the {origin.weights_xxh3_128} this model was "
                        f"fine-tuned from; its ranges would not be the chain's")
    return parent


__all__ = ["restate_training_statistics", "check_training_data", "initial_card"]
