"""The model card schema: what `load_reconstructor`, `namsa evaluate` and `namsa reconstruct` read
from ``model_card.json``, typed and bounded, checked before anything is built or allocated.

A model directory is a file a user may receive from anyone, so every field that code reads is
declared here with its type and range; unknown fields, missing required ones, wrong types,
non-finite numbers, JSON that is not an object, bytes that are not UTF-8 and cards larger than
`MAX_CARD_BYTES` are refused with one line (`ModelDirError`, a `UserError`: exit 2 in the CLI).
The informational sections are typed records too: what the trainer records of its run
(models/card_training.py), what `namsa publish` records of its provenance (models/card_provenance.py),
the ranges of the training data (models/card_statistics.py) and the error-vs-dose curve the low-dose
warning reads (models/card_dose.py); the configs a card carries are the
configs' own types (`namsa.SimulationConfig`, `stage.DataConfig`, `models.TrainConfig`).

The card file is opened and parsed by `models.safe_files` (no link followed, bounded JSON).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from namsa.config import Aberrations, SimulationConfig, Variations
from namsa.errors import UserError
from namsa.sampling import ScanSampling, config_sampling, sampling_fields
from stage.config import DataConfig

from .card_dose import DoseResponse
from .card_provenance import CheckSample, HeldOutEvaluation, TrainedOn
from .card_statistics import TrainingStatistics
from .card_training import ModelConfigRecord, TrainingFacts, TrainingMetrics
from .config import Architecture, ModelConfigError, TrainConfig, check_architecture
from .errors import ModelDirError
from .safe_files import open_regular, parse_json_bytes

CARD_FILE = "model_card.json"
MODEL_FILE = "model.safetensors"
#: the shipped card is 35 kB; a card is metadata, never data
MAX_CARD_BYTES = 4 << 20
#: a normaliser's statistics: inputs are log1p/sqrt of patterns carrying total intensity ~1 and targets
#: are in V*Angstrom or electrons/Angstrom^2 (the shipped card: 0.04 ... 1.5e3); beyond these they are absurd
NORMALIZER_LIMIT = 1e6
MIN_SPREAD = 1e-6

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, protected_namespaces=())
Pos = Annotated[int, Field(ge=1)]
TargetName = Literal["potential", "density"]


class ArchitectureSpec(BaseModel):
    """`models.config.Architecture` as a card states it, with bounds a real network stays within."""

    model_config = _STRICT

    in_channels: Annotated[int, Field(ge=1, le=1 << 20)]
    out_channels: Annotated[int, Field(ge=1, le=2)]
    init_channels: Annotated[int, Field(ge=1, le=1 << 16)]
    init_bias: bool
    growth_rate: Annotated[int, Field(ge=1, le=1 << 16)]
    kernel_size: Annotated[int, Field(ge=1, le=31)]
    levels: Annotated[int, Field(ge=0, le=8)]
    layers_per_block: Annotated[list[Annotated[int, Field(ge=1, le=1024)]], Field(min_length=1, max_length=17)]
    td_channels: Annotated[list[Annotated[int, Field(ge=1, le=1 << 20)]], Field(max_length=8)] | None
    skip: bool
    dense_bn: bool
    td_bn: bool
    bn_affine: bool
    pool: Literal["avg", "max"]
    tu_kernel: Annotated[int, Field(ge=1, le=16)]
    tu_stride: Annotated[int, Field(ge=2, le=8)]
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)]
    head_input: Literal["all", "new"]
    input_layout: Literal["patterns", "scan"] = "patterns"
    pattern_bins: Annotated[int, Field(ge=0, le=1024)] = 0
    scan_shape: Annotated[list[Annotated[int, Field(ge=0, le=1 << 20)]], Field(min_length=2, max_length=2)] = [0, 0]
    stem_kernel: Annotated[int, Field(ge=0, le=31)] = 0
    physics_inputs: Annotated[list[Literal["com_y", "com_x", "icom"]], Field(max_length=3)] = []
    icom_residual: Annotated[int, Field(ge=-1, le=1)] = -1
    # cards written before padding_mode existed: their weights were trained with zeros padding
    padding_mode: Literal["zeros", "circular"] = "zeros"

    @model_validator(mode="after")
    def _consistent(self) -> "ArchitectureSpec":
        if self.input_layout == "scan" and self.pattern_bins < 1:
            raise ValueError("the scan layout needs pattern_bins >= 1")
        try:
            check_architecture(self.architecture())
        except ModelConfigError as exc:
            raise ValueError(str(exc).replace("model.", "architecture.")) from None
        return self

    def architecture(self) -> Architecture:
        return Architecture.from_dict(self.model_dump())


Pair = Annotated[list[float], Field(min_length=2, max_length=2)]


class CalibrationRecord(BaseModel):
    """``normalizer.calibration``: the training set's typical `namsa.icom.ScanCalibration` (its
    ``to_dict``): scan shape, detector 1/Angstrom per pixel, beam energy (kV), probe step (Angstrom),
    the target grid's shift (fractions of the field of view) and whether the scan is periodic."""

    model_config = _STRICT

    scan_shape: Annotated[list[Annotated[int, Field(ge=1, le=1 << 16)]], Field(min_length=2, max_length=2)]
    k_sampling_invA: Pair | None = None
    energy_kv: Annotated[float, Field(gt=0, le=10_000)] | None = None
    scan_step_A: Pair | None = None
    shift_frac: Pair = [0.0, 0.0]
    periodic: bool = True


class NormalizerSpec(BaseModel):
    """`stage.Normalizer.to_dict()`: the input transform and the standardisation of each target."""

    model_config = _STRICT

    transform: Literal["none", "log1p", "sqrt"]
    cbed_mean: float
    cbed_std: Annotated[float, Field(gt=0)]
    intensity_scale: Annotated[float, Field(gt=0)]
    targets: dict[TargetName, Annotated[list[float], Field(min_length=2, max_length=2)]]
    # models with physics input channels (stage.physics_inputs): their standardisation and the
    # training set's typical scan calibration (namsa.icom.ScanCalibration.to_dict)
    physics: dict[Literal["com_y", "com_x", "icom"], Annotated[list[float], Field(min_length=2, max_length=2)]] | None = None
    calibration: CalibrationRecord | None = None

    @model_validator(mode="after")
    def _sane_statistics(self) -> "NormalizerSpec":
        """Every statistic finite and within `NORMALIZER_LIMIT`, every spread at least `MIN_SPREAD`:
        anything else turns finite weights into overflowing or all-NaN maps."""
        named = {"cbed_mean": (self.cbed_mean, False), "cbed_std": (self.cbed_std, True),
                 "intensity_scale": (self.intensity_scale, True)}
        for group, stats in (("targets", self.targets), ("physics", self.physics or {})):
            for name, (mean, std) in stats.items():
                named[f"{group}.{name} mean"], named[f"{group}.{name} std"] = (mean, False), (std, True)
        for name, (value, spread) in named.items():
            if not (math.isfinite(value) and abs(value) <= NORMALIZER_LIMIT and (not spread or value >= MIN_SPREAD)):
                need = f"in [{MIN_SPREAD:g}, {NORMALIZER_LIMIT:g}]" if spread else f"within +-{NORMALIZER_LIMIT:g}"
                raise ValueError(f"{name} is {value!r}, outside what a training set gives (must be {need}); the "
                                 f"normaliser is damaged")
        return self


class FileInfo(BaseModel):
    model_config = _STRICT

    bytes: Annotated[int, Field(ge=0, le=1 << 42)]
    xxh3_128: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class ExpectsInput(BaseModel):
    """The simulation physics a published model expects (read by `namsa reconstruct`): the training
    config's `namsa.sampling.SAMPLING_FIELDS`; `sampling` is what `namsa.sampling.config_sampling`
    derives from them (grid, detector pixel and scan step spans), computed once when the card is read."""

    model_config = _STRICT

    energy_kv: Annotated[float, Field(gt=0, le=10_000)]
    semiangle_mrad: Annotated[float, Field(gt=0, le=1_000)]
    sampling_A: Annotated[float, Field(gt=0, le=100)] | None = None
    gpts: Annotated[int, Field(ge=8, le=1 << 16)] | None = None
    scan_fov_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    scan_fov_A: Annotated[list[Annotated[float, Field(ge=0, le=1e6)]], Field(min_length=4, max_length=4)] | None = None
    fft_friendly_grid: bool | None = None
    scan_shape: Annotated[list[Annotated[int, Field(ge=1, le=1 << 16)]], Field(min_length=2, max_length=2)]
    pattern_px: Annotated[int, Field(ge=1, le=1 << 16)]
    target_px: Annotated[int, Field(ge=1, le=1 << 16)]
    cell_lateral_A: Annotated[float, Field(gt=0, le=1e6)]
    band_limit: Annotated[float, Field(gt=0, le=1)]
    thickness_A: Annotated[float, Field(gt=0)] | None = None
    aberrations: Aberrations | None = None
    variations: Variations | None = None
    _sampling: ScanSampling = PrivateAttr()

    @model_validator(mode="after")
    def _derive_sampling(self) -> "ExpectsInput":
        try:
            self._sampling = config_sampling(self.simulation_config())
        except (ValidationError, UserError) as exc:
            raise ValueError(f"not a simulation namsa can run ({' '.join(str(exc).split())[:160]})") from None
        return self

    @classmethod
    def of(cls, cfg: SimulationConfig, where: str = "the card") -> "ExpectsInput":
        """What a model trained on samples of ``cfg`` expects (`namsa.sampling.sampling_fields`): the
        one builder of ``expects_input``, for the trainer's export and `namsa publish`; one-line
        `ModelDirError` naming ``where`` when ``cfg`` leaves the card's bounds."""
        try:
            return cls.model_validate(sampling_fields(cfg))
        except ValidationError as exc:
            raise ModelDirError(f"{where}: expects_input.{first_validation_problem(exc)}") from None

    def simulation_config(self) -> SimulationConfig:
        """These fields as a `namsa.SimulationConfig` (unset ones at its defaults)."""
        return SimulationConfig.model_validate(self.model_dump(exclude_none=True))

    @property
    def sampling(self) -> ScanSampling:
        """Grid, detector pixel and scan step the model was trained on (`namsa.sampling.config_sampling`)."""
        return self._sampling


class DataInfo(BaseModel):
    """What the model was trained on; ``dirs`` are the training stores (absolute, this machine's)."""

    model_config = _STRICT

    dirs: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=4096)] | None = None
    node_local_dir: Annotated[str, Field(max_length=4096)] | None = None
    train_samples: Annotated[int, Field(ge=0)] | None = None
    dev_samples: Annotated[int, Field(ge=0)] | None = None
    input_shape: Annotated[list[Annotated[int, Field(ge=1)]], Field(max_length=4)] | None = None


class ModelCard(BaseModel):
    """Every field of ``model_card.json`` (trainer export, `workflow.pretrained` or a checkpoint's
    state); see the module docstring."""

    model_config = _STRICT

    format: Literal["namsa-reconstructor"]
    format_version: Literal[1]
    architecture: ArchitectureSpec
    targets: Annotated[list[TargetName], Field(min_length=1, max_length=2)]
    normalizer: NormalizerSpec
    files: dict[Literal["model.safetensors"], FileInfo]
    model_config_: Annotated[ModelConfigRecord | None, Field(alias="model_config")] = None
    target_units: dict[TargetName, str] | None = None
    data_manifest_hash: Annotated[str, Field(max_length=256)] | None = None
    code_version: Annotated[str, Field(max_length=256)] | None = None
    train_config: TrainConfig | None = None
    metrics: TrainingMetrics | None = None
    metrics_csv: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    training: TrainingFacts | None = None
    data: DataInfo | None = None
    parameters: Annotated[int, Field(ge=0)] | None = None
    forward_conv_ops_per_sample: Annotated[int, Field(ge=0)] | None = None
    expects_input: ExpectsInput | None = None
    trained_on: TrainedOn | None = None
    held_out_evaluation: HeldOutEvaluation | None = None
    training_statistics: TrainingStatistics | None = None   # models.card_writer, over the training split
    simulation_config: SimulationConfig | None = None   # a published card: the physics it was trained at ...
    data_config: DataConfig | None = None         # ... and how its samples were stored
    check_samples: Annotated[list[CheckSample], Field(max_length=64)] | None = None   # workflow.pretrained
    dose_response: DoseResponse | None = None   # models.card_dose: error vs dose, scripts/card_dose_curve.py
    name: Annotated[str, Field(max_length=256)] | None = None
    source: Literal["checkpoint"] | None = None
    step: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _targets_fit(self) -> "ModelCard":
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets {self.targets} repeat a name")
        if len(self.targets) != self.architecture.out_channels:
            raise ValueError(f"{len(self.targets)} targets but architecture.out_channels="
                             f"{self.architecture.out_channels}")
        missing = [t for t in self.targets if t not in self.normalizer.targets]
        if missing:
            raise ValueError(f"normalizer.targets has no statistics for {missing[0]}")
        if MODEL_FILE not in self.files:
            raise ValueError(f"files names no {MODEL_FILE}")
        return self

    @model_validator(mode="after")
    def _expects_fits_architecture(self) -> "ModelCard":
        """``expects_input`` decides the tiles `namsa reconstruct` cuts and stitches (scan_shape,
        pattern_px, target_px): they must be data the architecture takes and gives
        (`models.config.Architecture.data_mismatch`, the rule training and the config check ask)."""
        e = self.expects_input
        if e is None:
            return self
        (sy, sx), p, t = e.scan_shape, e.pattern_px, e.target_px
        problem = self.architecture.architecture().data_mismatch(sy * sx, p, t, (sy, sx))
        if problem:
            reason = problem.reason.replace("model.", "architecture.").replace("simulation.", "expects_input.")
            raise ValueError(f"expects_input (scan_shape [{sy}, {sx}], pattern_px {p}, target_px {t}) does not fit "
                             f"its architecture: {reason}; the card contradicts itself")
        return self

    @model_validator(mode="after")
    def _lineage_ends_here(self) -> "ModelCard":
        """``training.lineage`` ends at the weights beside the card (`TrainingFacts.check_weights`)."""
        if self.training is not None and MODEL_FILE in self.files:
            self.training.check_weights(self.files[MODEL_FILE].xxh3_128)
        return self

    def to_json(self) -> dict[str, Any]:
        """The card as JSON values, exactly the fields it was given (what `models.card_writer` writes)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def first_validation_problem(exc: ValidationError) -> str:
    """The first problem of a pydantic error as ``field: what``, on one line."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "the card"
    if err["type"] == "extra_forbidden":
        return f"unknown field {where}"
    if err["type"] == "missing":
        return f"missing field {where}"
    shown = repr(err.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{where}: {err['msg']} (got {shown})"


def validate_card(obj: Any, where: str) -> ModelCard:
    """``obj`` (parsed JSON) as a `ModelCard`; one-line `ModelDirError` naming the field otherwise."""
    if not isinstance(obj, dict):
        raise ModelDirError(f"{where} is not a model card: it holds a JSON {type(obj).__name__}, not an object; "
                            f"use the {CARD_FILE} that namsa train wrote")
    try:
        return ModelCard.model_validate(obj)
    except ValidationError as exc:
        raise ModelDirError(f"{where}: {first_validation_problem(exc)}; use the {CARD_FILE} that namsa train wrote "
                            f"(or re-export the model)") from None


def read_card_file(path: Path) -> ModelCard:
    """The validated card of the card file ``path``, read with a size cap."""
    where = f"model card {path}"
    with open_regular(path, "model card") as fh:
        try:
            raw = fh.read(MAX_CARD_BYTES + 1)
        except OSError as exc:
            raise ModelDirError(f"{where} cannot be read ({exc.strerror or exc}); check the model directory") from None
    return validate_card(parse_json_bytes(raw, where, MAX_CARD_BYTES), where)


__all__ = ["ModelCard", "ArchitectureSpec", "NormalizerSpec", "ExpectsInput", "TrainingStatistics", "validate_card",
           "first_validation_problem", "read_card_file", "CARD_FILE", "MODEL_FILE", "MAX_CARD_BYTES"]

