"""Building and writing a model card: the one builder from a checkpoint state, the one builder of a
published card and the one writer.

`card_from_state` is how every card starts (the trainer's export, the card `load_reconstructor` makes
for a checkpoint directory); `published_card` is how `namsa publish` turns a trained model's card into
a shipped one (its provenance records added, this machine's paths left out); `write_card` is how every
card reaches disk (the trainer's export, `workflow.pretrained`): validated first, then written whole
through `stage.jsonfile.write_json_atomic` (a temporary file in the same folder, fsync, os.replace), so
a reader, or a write that is killed or fails half-way, sees the old card or the new one, never a part.

A card built from a run that names its training stores (``data.dirs``) records the ranges of the
input's cheap statistics over their training split (``training_statistics``: defocus, scattering,
dose; `stage.scan_statistics`), which `Reconstructor.predict`'s input report compares each input with;
a fine-tune's card, the union of those and its initial model's (`training_statistics`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from namsa.config import MACHINE_FIELDS, SimulationConfig
from namsa.errors import NamsaError
from stage.config import DataConfig
from stage.jsonfile import write_json_atomic

from .card import CARD_FILE, MODEL_FILE, DataInfo, ExpectsInput, ModelCard, first_validation_problem, validate_card
from .card_provenance import CheckSample, HeldOutEvaluation, TrainedOn
from .card_statistics import TrainingStatistics, union_statistics
from .errors import ModelDirError

#: the checkpoint state's entries a card copies as they are
STATE_FIELDS = ("model_config", "architecture", "targets", "normalizer", "data_manifest_hash", "code_version",
                "train_config")


def card_from_state(state: Mapping[str, Any], where: str, *, parent: ModelCard | None = None,
                    **fields: Any) -> ModelCard:
    """A validated card from a verified checkpoint ``state`` (`models.checkpoint.verify_checkpoint`):
    its `STATE_FIELDS`, format and weights entry, then ``fields`` (records or their JSON, which win),
    and the training statistics of the stores its ``data.dirs`` names (`training_statistics`; joined with
    those of ``parent``, the card of the model a fine-tune started from) unless given; one-line
    `models.card.ModelDirError` naming ``where`` when the result is not a card."""
    values: dict[str, Any] = {k: state[k] for k in STATE_FIELDS if k in state}
    values.update(format="namsa-reconstructor", format_version=state.get("format_version"),
                  files={MODEL_FILE: (state.get("files") or {}).get(MODEL_FILE)})
    values.update(fields)
    card = validate_card(values, where)
    if card.training_statistics is None:
        statistics = training_statistics(card.data, parent)
        if statistics is not None:
            card = validate_card({**values, "training_statistics": statistics}, where)
    return card


def training_statistics(data: DataInfo | None, parent: ModelCard | None = None) -> dict[str, Any] | None:
    """The card's ``training_statistics`` (`models.card.TrainingStatistics`, as JSON): the range of each
    cheap statistic of the input over the training split of the stores ``data.dirs`` names
    (`stage.scan_statistics.split_ranges`); None without stores, with no training sample, or when
    the stores cannot be read (the card is still written: its input report then says what it lacks).
    For a fine-tune, ``parent`` (the card of the model it started from, `training.init_from`): the union
    of its statistics and the split's (`models.card_statistics.union_statistics`, which notes a parent
    without them)."""
    from stage.scan_statistics import STATISTICS_VERSION

    split = _split_statistics(data)
    if parent is None:
        return split
    try:
        typed = None if split is None else TrainingStatistics.model_validate(split)
    except ValidationError as exc:
        raise ModelDirError(f"the training split's statistics: {first_validation_problem(exc)}") from None
    joined = union_statistics(parent.training_statistics, typed, parent.name or "the initial model",
                              STATISTICS_VERSION)
    return None if joined is None else joined.model_dump(mode="json", exclude_unset=True)


def _split_statistics(data: DataInfo | None) -> dict[str, Any] | None:
    """`stage.scan_statistics.split_ranges` of the training split of ``data.dirs``; None without stores,
    training samples, or readable stores."""
    dirs = data.dirs if data is not None else None
    if not dirs:
        return None
    from stage.scan_statistics import split_ranges

    try:
        return split_ranges(dirs, "train")
    except NamsaError:  # a store gone or damaged since training: the weights are still worth a card
        return None


def published_card(card: ModelCard, where: str, *, name: str, simulation: SimulationConfig, data: DataConfig,
                   trained_on: TrainedOn, held_out_evaluation: HeldOutEvaluation,
                   check_samples: list[CheckSample]) -> ModelCard:
    """``card`` as `namsa publish` ships it under ``name``: what its input must be (``expects_input``,
    `ExpectsInput.of` the run's ``simulation``), the samples' physics and storage (``simulation_config``
    without the machine's fields, ``data_config``) and the provenance records; without this machine's
    paths (the metrics CSV and the training stores are dropped, any other absolute path, e.g. of the
    stores it was scored on, is cut to its last part, ``store-000``, which still names the data).
    One-line `models.card.ModelDirError` naming ``where`` when the result is not a card."""
    kept = {f.alias or key: getattr(card, key) for key, f in ModelCard.model_fields.items()
            if key in card.model_fields_set and key not in ("metrics_csv", "data")}
    if card.data is not None:
        kept["data"] = DataInfo.model_validate(card.data.model_dump(exclude={"dirs", "node_local_dir"},
                                                                    exclude_unset=True))
    shipped = validate_card({
        **kept, "name": name, "expects_input": ExpectsInput.of(simulation, where),
        # every field stated, as the run's config resolved them; the machine's left out
        "simulation_config": SimulationConfig.model_validate(simulation.model_dump(mode="json",
                                                                                   exclude=set(MACHINE_FIELDS))),
        "data_config": DataConfig.model_validate(data.model_dump(mode="json")),
        "trained_on": trained_on, "held_out_evaluation": held_out_evaluation, "check_samples": check_samples},
        where)
    return validate_card(_without_absolute_paths(shipped.to_json()), where)


def _without_absolute_paths(value: Any) -> Any:
    """``value`` (JSON) with every absolute path cut to its last component."""
    if isinstance(value, dict):
        return {k: _without_absolute_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_absolute_paths(v) for v in value]
    if isinstance(value, str) and Path(value).is_absolute():
        return Path(value).name
    return value


def write_card(folder: str | Path, card: ModelCard) -> Path:
    """Write ``card`` as ``folder/model_card.json`` atomically (see the module docstring); returns the path."""
    path = Path(folder) / CARD_FILE
    write_json_atomic(path, card.to_json(), sort_keys=True)
    return path


__all__ = ["card_from_state", "published_card", "training_statistics", "write_card", "STATE_FIELDS"]
