"""What a published model card says of where its model comes from, typed and bounded: the data and
physics it was trained on (``trained_on``), its held-out scores (``held_out_evaluation``: the verdict
and the report read them) and the held-out samples whose figures can be re-made (``check_samples``).

`namsa publish` (workflow/pretrained.py) builds them from a finished run: its config (`TrainedOn.of`)
and its metrics.json (read into `EvaluatedData`, `Headline` and `Aggregates` by
workflow/publish_inputs.py). Scores are in each metric's units (evaluation/metric_registry.py).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from namsa.config import SimulationConfig, Variations
from namsa.generator import GeneratorConfig
from stage.config import CameraAugmentationConfig, DataConfig, SymmetryAugmentationConfig
from stage.splits import SplitBy

from .card_statistics import DoseAugmentationRecord
from .config import TargetName

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
#: a name in a card's tables: a method, a view, a metric, a split, an element class, a material id
Key = Annotated[str, Field(min_length=1, max_length=256)]
Count = Annotated[int, Field(ge=0)]


class AggregateStat(BaseModel):
    """One metric of one method in one view over the held-out samples (`evaluation.aggregation`): its
    mean ``value`` with the bootstrap interval [``low``, ``high``] over materials, the median, and how
    many values (``n``), materials (``n_groups``) and non-finite values it saw; None where none was finite."""

    model_config = _STRICT

    value: float | None
    low: float | None
    high: float | None
    n: Count
    n_nonfinite: Count
    n_groups: Count | None = None
    median: float | None = None


#: held_out_evaluation.aggregates[target][method][view][metric]
Aggregates = dict[TargetName, Annotated[dict[Key, Annotated[dict[Key, Annotated[dict[Key, AggregateStat],
                                                                                 Field(max_length=64)]],
                                                            Field(max_length=16)]], Field(max_length=32)]]
Score = float | None
#: held_out_evaluation.headline[target][method][view][metric] (cards scored before issue 30:
#: headline[target][method][metric], the legacy rule's; `evaluation.views.headline_scores` reads both)
Headline = dict[TargetName, Annotated[dict[Key, Annotated[dict[Key, Score | Annotated[dict[Key, Score],
                                                                                      Field(max_length=64)]],
                                                          Field(max_length=64)]], Field(max_length=32)]]


class ArrayInfo(BaseModel):
    """One array of the stored samples: its dtype (numpy's ``str``), stored scale and shape."""

    model_config = _STRICT

    dtype: Key
    scale: float
    shape: Annotated[list[Count], Field(max_length=8)]


class EvaluatedData(BaseModel):
    """``trained_on.data``: metrics.json's ``data``, the stores the model was evaluated on (their names),
    samples per split, arrays, physics hash and code version, the materials of each split, the split
    evaluated and the data config they were read with."""

    model_config = _STRICT

    stores: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=4096)] = []
    counts: dict[Key, Count] = {}
    arrays: Annotated[dict[Key, ArrayInfo], Field(max_length=16)] = {}
    config_hash: Key | None = None
    code_version: Key | None = None
    materials: Annotated[dict[Key, Annotated[list[Key], Field(max_length=1 << 20)]], Field(max_length=8)] = {}
    evaluated_split: Key | None = None
    data_config: DataConfig | None = None


class TrainedOn(BaseModel):
    """``trained_on``: the run's config name, what its samples spanned besides the microscope
    (structure sources, zone axes, variants, thickness, tilt, phonons: its `namsa.SimulationConfig`'s
    plan and variations), how they were split and augmented (its `stage.DataConfig`: the dose, symmetry
    and camera augmentations; cards published before the camera augmentation have none), and the data it
    was evaluated on."""

    model_config = _STRICT

    config_name: Key
    variants: Annotated[int, Field(ge=1)] | None = None
    #: the first of them (`SimulationConfig.first_variant`; cards before it: 0)
    first_variant: Annotated[int, Field(ge=0)] = 0
    data: EvaluatedData | None = None
    materials: Annotated[list[Key], Field(max_length=1 << 16)] | Literal["library"] | None = None
    generator: GeneratorConfig | None = None
    zone_axes: Annotated[list[Annotated[list[int], Field(min_length=3, max_length=3)]],
                         Field(max_length=1024)] | Literal["auto"] | None = None
    max_zone_axes: Annotated[int, Field(ge=1)] | None = None
    variations: Variations | None = None
    split_by: SplitBy | None = None
    dose_augmentation: DoseAugmentationRecord | None = None
    symmetry_augmentation: SymmetryAugmentationConfig | None = None
    camera_augmentation: CameraAugmentationConfig | None = None

    @classmethod
    def of(cls, config_name: str, simulation: SimulationConfig, data: DataConfig,
           evaluated: EvaluatedData) -> "TrainedOn":
        """What a run of config ``config_name`` trained on: the plan of ``simulation``, the split and
        augmentations of ``data``, evaluated on ``evaluated``."""
        sim = simulation.model_dump(mode="json")
        stored = data.model_dump(mode="json")
        return cls.model_validate({"config_name": config_name, "variants": sim["variants"],
                                   "first_variant": sim["first_variant"], "data": evaluated,
                                   **{k: sim[k] for k in ("materials", "generator", "zone_axes", "max_zone_axes",
                                                          "variations")},
                                   **{k: stored[k] for k in ("split_by", "dose_augmentation",
                                                             "symmetry_augmentation", "camera_augmentation")}})


class HeldOutEvaluation(BaseModel):
    """``held_out_evaluation``: the split scored, the headline figures and the aggregates per target,
    method, view and metric, and whether the network's maps were averaged over the 8 turns
    (`evaluation.symmetry_average`; cards published before it existed were scored with the single pass)."""

    model_config = _STRICT

    split: Key
    headline: Headline | None = None
    aggregates: Aggregates | None = None
    symmetry_average: bool = False


class CheckSample(BaseModel):
    """One of ``check_samples``: a held-out sample (by id) whose figures tests/test_pretrained_figures.py
    re-makes from scratch, its element class and the network's relative L2 per target as predicted."""

    model_config = _STRICT

    sample_id: Key
    element_class: Key
    network_rel_l2: Annotated[dict[TargetName, Annotated[float, Field(ge=0)]], Field(min_length=1)]


__all__ = ["AggregateStat", "Aggregates", "Headline", "ArrayInfo", "EvaluatedData", "TrainedOn", "HeldOutEvaluation",
           "CheckSample"]
