"""The model card (`models.card`) as rows a reader can scan: architecture, training data, optimiser
and schedule, training result, files, and a published card's held-out scores under the rule they were
scored by; every value written as text, never as a JSON blob."""
from __future__ import annotations

from typing import Any

from .methods import method, names
from .views import VIEW_TITLES, headline_scores

#: (section, label, path into the card); rows whose path is absent are left out.
CARD_ROWS: tuple[tuple[str, str, str], ...] = (
    ("architecture", "network", "format"),
    ("architecture", "preset", "model_config.preset"),
    ("architecture", "input layout", "architecture.input_layout"),
    ("architecture", "scan grid (patterns in)", "architecture.scan_shape"),
    ("architecture", "input channels", "architecture.in_channels"),
    ("architecture", "levels", "architecture.levels"),
    ("architecture", "layers per dense block", "architecture.layers_per_block"),
    ("architecture", "growth rate", "architecture.growth_rate"),
    ("architecture", "first-layer channels", "architecture.init_channels"),
    ("architecture", "parameters", "parameters"),
    ("architecture", "convolution multiply-adds per sample", "forward_conv_ops_per_sample"),
    ("architecture", "targets", "targets"),
    ("training data", "training samples", "data.train_samples"),
    ("training data", "dev samples (picks the exported checkpoint)", "data.dev_samples"),
    ("training data", "input shape (patterns, pixels, pixels)", "data.input_shape"),
    ("training data", "stores", "data.dirs"),
    ("training data", "pattern transform", "normalizer.transform"),
    ("training data", "pattern intensity scale", "normalizer.intensity_scale"),
    ("training data", "target mean, std (standardisation)", "normalizer.targets"),
    ("optimiser", "optimiser", "train_config.optimizer"),
    ("optimiser", "initial learning rate", "train_config.lr0"),
    ("optimiser", "warm-up steps", "train_config.warmup_steps"),
    ("optimiser", "decay every (steps; 0 = constant)", "train_config.decay_every"),
    ("optimiser", "decay factor", "train_config.decay_factor"),
    ("optimiser", "weight decay", "train_config.weight_decay"),
    ("optimiser", "Adam betas", "train_config.adam_betas"),
    ("optimiser", "batch size per rank", "training.batch_size_per_rank"),
    ("optimiser", "ranks", "training.world_size"),
    ("optimiser", "precision", "train_config.precision"),
    ("optimiser", "Huber delta (start, decay per step)", "train_config.huber_delta0"),
    ("optimiser", "seed", "train_config.seed"),
    ("training result", "length", "training.length"),
    ("training result", "steps run", "training.steps"),
    ("training result", "samples seen", "training.samples_seen"),
    ("training result", "exported checkpoint", "training.checkpoint"),
    ("training result", "best dev loss (step)", "metrics.best_dev_loss"),
    ("training result", "final train loss", "metrics.final_train_loss"),
    ("training result", "wall time (s)", "training.wall_s"),
    ("files", "code version", "code_version"),
    ("files", "weights", "files"),
)


def card_rows(card: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(section, label, text) for every `CARD_ROWS` entry the card holds, then `held_out_rows`."""
    rows = []
    for section, label, path in CARD_ROWS:
        value = lookup(card, path)
        if value is None:
            continue
        if path == "metrics.best_dev_loss" and lookup(card, "metrics.best_step") is not None:
            rows.append((section, label, f"{text(value)} (step {lookup(card, 'metrics.best_step')})"))
        elif path == "train_config.huber_delta0":
            rows.append((section, label, f"{text(value)}, × {text(lookup(card, 'train_config.huber_decay'))}"))
        else:
            rows.append((section, label, text(value)))
    return rows + held_out_rows(card)


def held_out_rows(card: dict[str, Any]) -> list[tuple[str, str, str]]:
    """One row per target of a published card's held-out relative L2 per method, labelled with its rule:
    a card written before issue 30 holds the legacy rule's (network as predicted, baselines fitted)."""
    held = card.get("held_out_evaluation") or {}
    rows = []
    for target, per_method in (held.get("aggregates") or {}).items():
        view, scores = headline_scores(per_method or {})
        values = "; ".join(f"{method(m).short_label} {text(scores[m]['rel_l2'].get('value'))}" for m in names()
                           if isinstance(scores.get(m, {}).get("rel_l2"), dict))
        if values:
            rows.append(("held-out evaluation", f"{target} relative L2 ({held.get('split', '?')} split), "
                         f"{VIEW_TITLES[view]}", values))
    return rows


def lookup(card: dict[str, Any], path: str) -> Any:
    """``card[a][b]...`` for the dotted ``path``; None where any part is missing."""
    value: Any = card
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def text(value: Any) -> str:
    """A card value in words: lists joined, mappings as "key: value" pairs, numbers grouped."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return " × ".join(text(v) for v in value) if all(isinstance(v, int) for v in value) and len(value) <= 4 \
            else ", ".join(text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_inner(v)}" for k, v in value.items())
    return "–" if value is None else str(value)


def _inner(value: Any) -> str:
    """A nested value: a file entry's size, else its text."""
    if isinstance(value, dict) and "bytes" in value:
        return f"{value['bytes']:,} bytes"
    return text(value)
