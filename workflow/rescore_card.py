"""A published reconstructor's held-out figures replaced by a newer evaluation of the same weights, so
that its card, README and the report quote one figure.

    python scripts/card_rescore.py models/pretrained/study-scan-gpu runs/rescore-new-plan/eval-study-scan-gpu

A card's ``held_out_evaluation`` and ``check_samples`` are what `namsa publish` took from its run's
evaluation (workflow/pretrained.py). When the same weights are scored again on a held-out split, e.g.
with their maps averaged over the scan's 8 turns (`evaluation.symmetry_average`, `Reconstructor.predict`'s
default since), those two records are replaced by the new evaluation's; every other field of the card is
kept as it was (checked after writing) and the weights are not touched. Refused in one line: an
evaluation of other weights (metrics.json's ``model_card`` digest), of a split that is not held out, or a
metrics.json that is not `namsa evaluate`'s.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models import checkpoint as ckpt
from models.card import CARD_FILE, read_card_file, validate_card
from models.card_writer import write_card
from models.reconstructor import load_reconstructor
from namsa.errors import UserError

from .pretrained import check_samples, held_out_evaluation
from .publish_inputs import HeldOutMetrics, read_metrics

#: what this replaces of a card; everything else is kept byte for byte (as JSON values)
REPLACED = ("held_out_evaluation", "check_samples")
HELD_OUT_SPLITS = ("test",)


def rescore_published(folder: str | Path, eval_dir: str | Path) -> dict[str, object]:
    """Replace the card of published model ``folder``'s `REPLACED` records with those of the evaluation
    in ``eval_dir`` (its metrics.json); returns the new ``held_out_evaluation`` as JSON."""
    folder, eval_dir = Path(folder), Path(eval_dir)
    card = read_card_file(folder / CARD_FILE)
    metrics = read_metrics(eval_dir)
    check_held_out_evaluation(card.files[ckpt.MODEL_FILE].xxh3_128, metrics, eval_dir)
    records = {"held_out_evaluation": held_out_evaluation(metrics).model_dump(mode="json"),
               "check_samples": [c.model_dump(mode="json") for c in check_samples(metrics)]}
    rewrite_card_records(folder, records)
    return records["held_out_evaluation"]


def rewrite_card_records(folder: Path, records: dict[str, Any]) -> None:
    """Replace the top-level ``records`` (field -> JSON value) of ``folder``'s card, validated as a card;
    every other field is checked to be kept as it was (as JSON values) and the weights to still match the
    card's digest (by loading the model)."""
    before = json.loads((folder / CARD_FILE).read_text())
    write_card(folder, validate_card({**before, **records}, str(folder / CARD_FILE)))
    after = json.loads((folder / CARD_FILE).read_text())
    if {k: v for k, v in after.items() if k not in records} != {k: v for k, v in before.items() if k not in records}:
        raise RuntimeError(f"rewriting {folder / CARD_FILE} changed fields other than {sorted(records)}")
    load_reconstructor(folder, device="cpu")   # the weights still match the card's digest


def check_held_out_evaluation(digest: str, metrics: HeldOutMetrics, eval_dir: Path) -> None:
    """One-line `UserError` unless ``eval_dir``'s ``metrics`` scored the weights of xxh3_128 ``digest`` on a
    held-out split (what a card may state as its held-out figures)."""
    evaluated = metrics.model_card.files.get(ckpt.MODEL_FILE) if metrics.model_card else None
    if evaluated is None:
        raise UserError(f"{eval_dir}/metrics.json does not say which weights it scored (no model_card); "
                        "evaluate the published model again with namsa evaluate")
    if evaluated.xxh3_128 != digest:
        raise UserError(f"{eval_dir}/metrics.json scored other weights (xxh3_128 {evaluated.xxh3_128}) than the "
                        f"card's ({digest}); evaluate this model (--model its folder or pretrained:NAME)")
    if metrics.config.split not in HELD_OUT_SPLITS:
        raise UserError(f"{eval_dir} scored the {metrics.config.split!r} split; a card states held-out figures "
                        f"only ({' or '.join(HELD_OUT_SPLITS)}): evaluate with --set evaluation.split=test")


__all__ = ["rescore_published", "rewrite_card_records", "check_held_out_evaluation", "REPLACED", "HELD_OUT_SPLITS"]
