"""What a model card records of the run that trained its model, typed and bounded: the resolved model
config (``model_config``), the losses (``metrics``), the run's length, speed and machine
(``training``), the model it was fine-tuned from (``training.initialized_from``) and the chain of runs
that made its weights (``training.lineage``: one `LineageLink` per run, the first from scratch, each
next one fine-tuning the weights of the link before it, the last this card's own run).

The trainer's export builds them (`models.training.export.card_extra`), the card of a checkpoint
directory takes its ``metrics`` from the checkpoint's position (`position_metrics`, the one mapping of a
training position to the card's losses). Units: seconds, TFLOP/s; losses on standardised targets.
"""
from __future__ import annotations

import datetime
import math
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .config import ModelConfig

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
Count = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(max_length=256)]
Rate = Annotated[float, Field(ge=0)]
#: an xxh3_128 digest of a weights file, as `models.checkpoint.file_digest` writes it
Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
#: the most links a card's chain holds (a fine-tune of a card holding as many is refused at its start)
MAX_LINEAGE = 256


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


class LineageLink(BaseModel):
    """One run of a card's chain (``training.lineage``): the weights it produced (xxh3_128 of its
    model.safetensors), the distinct training samples it had (``data.train_samples``), its steps,
    samples drawn (``samples_seen``), device and wall-clock seconds, the name its model was published
    under (None before `namsa publish`) and the UTC date of its export (ISO ``YYYY-MM-DD``; None where
    unknown: a link made from a card written before the chain existed)."""

    model_config = _STRICT

    name: Name | None = None
    weights_xxh3_128: Digest
    train_samples: Count | None = None
    steps: Count | None = None
    samples_seen: Count | None = None
    device: Name | None = None
    wall_s: Rate | None = None
    date: Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")] | None = None

    @field_validator("date")
    @classmethod
    def _a_calendar_date(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                datetime.date.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{value!r} is no calendar date; write the export's UTC date as YYYY-MM-DD") from None
        return value


def today_utc() -> str:
    """Today's date in UTC as ``YYYY-MM-DD``: a link's ``date``."""
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


class InitialModelFacts(BaseModel):
    """``training.initialized_from``: the model a fine-tuned run started from (`training.init_from`)."""

    model_config = _STRICT

    model: Annotated[str, Field(max_length=4096)]
    name: Name | None = None
    weights_xxh3_128: Digest
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
    lineage: Annotated[list[LineageLink], Field(min_length=1, max_length=MAX_LINEAGE)] | None = None

    @model_validator(mode="after")
    def _lineage_fits(self) -> "TrainingFacts":
        problem = lineage_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    def check_weights(self, weights_xxh3_128: str) -> None:
        """ValueError unless the chain (if any) ends at the card's weights ``weights_xxh3_128``
        (``files["model.safetensors"].xxh3_128``): the card's own check (`models.card.ModelCard`)."""
        last = self.lineage[-1] if self.lineage else None
        if last is not None and last.weights_xxh3_128 != weights_xxh3_128:
            raise ValueError(f"training.lineage ends at weights {last.weights_xxh3_128} but files.model.safetensors "
                             f"is {weights_xxh3_128}; the chain's last link must be the weights beside the card "
                             f"(re-export the model)")


def lineage_problem(training: TrainingFacts) -> str | None:
    """What contradicts itself in ``training.lineage``, in one line; None when nothing does (or no chain):
    its last link is this run (``steps``), the link before is the model it was fine-tuned from
    (``initialized_from``; a run not fine-tuned has one link) and its dates never go backwards."""
    links = training.lineage
    if not links:
        return None
    if links[-1].steps != training.steps:
        return (f"training.lineage's last link has {links[-1].steps} steps but training.steps is {training.steps}; "
                f"the chain must end with this run (re-export the model)")
    origin = training.initialized_from
    if origin is None and len(links) > 1:
        return (f"training.lineage has {len(links)} links but no training.initialized_from; a run not fine-tuned "
                f"has one link (re-export the model)")
    if origin is not None and (len(links) < 2 or links[-2].weights_xxh3_128 != origin.weights_xxh3_128):
        before = links[-2].weights_xxh3_128 if len(links) > 1 else "nothing"
        return (f"training.lineage's link before the last is {before} but training.initialized_from is "
                f"{origin.weights_xxh3_128}; the chain must pass through the model it was fine-tuned from")
    dates = [(i, link.date) for i, link in enumerate(links, 1) if link.date is not None]
    for (i, earlier), (j, later) in zip(dates, dates[1:]):
        if later < earlier:
            return (f"training.lineage's link {j} is dated {later}, before link {i}'s {earlier}; a chain's dates "
                    f"never go backwards")
    return None


__all__ = ["ModelConfigRecord", "TrainingMetrics", "TrainingFacts", "InitialModelFacts", "LineageLink",
           "MAX_LINEAGE", "lineage_problem", "position_metrics", "today_utc"]
