"""What a model card records of the run that trained its model, typed and bounded: the resolved model
config (``model_config``), the losses (``metrics``), the run's length, speed and machine
(``training``) and the model it was fine-tuned from (``training.initialized_from``).

The trainer's export builds them (`models.training.export.card_extra`), the card of a checkpoint
directory takes its ``metrics`` from the checkpoint's position (`position_metrics`, the one mapping of a
training position to the card's losses). Units: seconds, TFLOP/s; losses on standardised targets.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from .config import ModelConfig

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
Count = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(max_length=256)]
Rate = Annotated[float, Field(ge=0)]


class ModelConfigRecord(ModelConfig):
    """``model_config``: the `models.config.ModelConfig` the model was trained with, every field the
    preset decides written out (`models.training.export.resolved_model_config`), and ``overrides``,
    the fields the config set itself."""

    overrides: Annotated[list[Name], Field(max_length=64)] = []
    # two fields the preset decides are written out as the resolved `Architecture` holds them:
    #: -1 (off) or the potential's output channel, or the config's bool where it set it
    icom_residual: bool | Annotated[int, Field(ge=-1, le=1)] | None = None
    #: 0 for the patterns layout, which bins nothing
    pattern_bins: Annotated[int, Field(ge=0, le=1024)] | None = None


class TrainingMetrics(BaseModel):
    """``metrics``: the best and the last dev loss, the last training loss (on standardised targets,
    ``dev_loss_definition``), and the step of the best (the weights exported)."""

    model_config = _STRICT

    best_dev_loss: float | None = None
    best_step: Count | None = None
    final_dev_loss: float | None = None
    final_train_loss: float | None = None
    dev_loss_definition: Name | None = None


def position_metrics(position: Mapping[str, Any], definition: str | None = None) -> dict[str, Any]:
    """The card's ``metrics`` (`TrainingMetrics`'s fields) of a training position
    (`models.training.run_state.Position` as a mapping: its best and last losses); a loss that is not
    finite (a diverged step) is None, as JSON holds no NaN; ``definition``: what the dev loss is."""
    def finite(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    metrics = {"best_dev_loss": finite(position.get("best_dev_loss")), "best_step": position.get("best_step"),
               "final_dev_loss": finite(position.get("last_dev_loss")),
               "final_train_loss": finite(position.get("last_train_loss"))}
    return metrics if definition is None else {**metrics, "dev_loss_definition": definition}


class InitialModelFacts(BaseModel):
    """``training.initialized_from``: the model a fine-tuned run started from (`training.init_from`)."""

    model_config = _STRICT

    model: Annotated[str, Field(max_length=4096)]
    name: Name | None = None
    weights_xxh3_128: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    steps: Count | None = None
    device: Name | None = None


class TrainingFacts(BaseModel):
    """``training``: how long the run trained (steps, epochs, what bounded it and in words), on what
    (ranks, engine, precision, device) and how fast (TFLOP/s); seconds of wall-clock time."""

    model_config = _STRICT

    steps: Count | None = None
    epochs_completed: Count | None = None
    length_bound_by: Literal["max_steps", "epochs"] | None = None
    steps_planned: Count | None = None
    steps_per_epoch: Count | None = None
    stopped_by: Literal["max_steps", "epochs", "max_wall_s"] | None = None
    length: Annotated[str, Field(max_length=1024)] | None = None
    samples_seen: Count | None = None
    skipped_steps: Count | None = None
    wall_s: Rate | None = None
    world_size: Annotated[int, Field(ge=1)] | None = None
    optimizer: Name | None = None
    gradient_engine: Name | None = None
    precision: Name | None = None
    batch_size_per_rank: Annotated[int, Field(ge=1)] | None = None
    exported: Literal["best", "final"] | None = None
    checkpoint: Name | None = None
    sustained_tflops: Rate | None = None
    peak_tflops: Rate | None = None
    device: Name | None = None
    initialized_from: InitialModelFacts | None = None


__all__ = ["ModelConfigRecord", "TrainingMetrics", "TrainingFacts", "InitialModelFacts", "position_metrics"]
