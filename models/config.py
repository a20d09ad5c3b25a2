"""Model and training configuration (pydantic v2 sections ``model:`` and ``training:``).

`ModelConfig` names a preset (``paper`` | ``small`` | ``tiny``) and optional per-field overrides;
`ModelConfig.architecture()` resolves them into a frozen `Architecture` that `build_model` builds.
`TrainConfig` holds the optimiser, schedules, precision, batch/steps and checkpoint cadence.

The ``paper`` preset reproduces Laanait, Romero et al. (2019) exactly (see ../shared/FACTS.md):
220,399,104 parameters and 1.7170e13 forward conv ops at 1024 x 512 x 512. The two widths the
paper does not state were solved for those two counts: the initial conv has 256 output channels
(= the growth rate), each transition down keeps its input width, and its batch norm has no
learnable affine (a learnable scale/shift would add 2 x (512 + 1024 + 2048) = 7,168 parameters).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from namsa.errors import UserError
from namsa.random_streams import MAX_SEED

from .presets import PRESETS

TargetName = Literal["potential", "density"]
PhysicsInputName = Literal["com_y", "com_x", "icom"]
PresetName = Literal["paper", "small", "tiny", "scan"]


class ModelConfigError(UserError):
    """A model configuration that cannot be built."""


@dataclass(frozen=True)
class Architecture:
    """Every knob of the FC-DenseNet, resolved (no None).

    in_channels:      S, diffraction patterns per sample (the scan size, 32 x 32 = 1024 in the paper).
    out_channels:     C, one per target (potential and/or density).
    init_channels:    output channels of the initial conv.
    init_bias:        the initial conv has a bias (the paper's does).
    growth_rate:      k, feature maps each dense layer adds.
    kernel_size:      R = S of the initial conv and of every dense-layer conv (odd; 'same' padding).
    levels:           pooling levels (the encoder halves the size this many times).
    layers_per_block: 2 * levels + 1 numbers: encoder blocks, bottleneck, decoder blocks.
    td_channels:      output width of each transition down; None = keep the input width.
    skip:             concatenate encoder features into the decoder (U-Net style skips).
    dense_bn:         batch norm before each dense layer's ReLU (the paper's dense layer has none).
    td_bn:            batch norm at the start of each transition down.
    bn_affine:        learnable scale/shift in those batch norms.
    pool:             ``avg`` (the paper) or ``max`` pooling in the transition down.
    tu_kernel, tu_stride: the transposed conv of each transition up; tu_stride is also the
                      pooling factor, so encoder and decoder sizes match.
    dropout:          dropout probability after each dense-layer and transition-down conv.
    head_input:       ``all``: the head sees the whole output of the last block (its input and its
                      new features, as in Jegou et al. 2017); ``new``: only the new features.
    input_layout:     ``patterns`` (the paper's): the S patterns are the channels and the pattern
                      pixels (ky, kx) the spatial axes; the output map has the pattern's size.
                      ``scan``: the probe positions (y, x) are the spatial axes and each pattern,
                      averaged down to ``pattern_bins`` x ``pattern_bins`` pixels, gives the
                      channels (Friedrich et al. 2022, Microsc. Microanal. 29, 395); a conv then
                      sees the patterns of adjacent probe positions together, and the output map
                      has the scan's size, pixel (i, j) at probe position (i, j).
    pattern_bins:     side of the binned pattern in the scan layout (channels = pattern_bins^2).
    stem_kernel:      kernel of the initial conv; 0 = ``kernel_size``. 1 in the scan layout makes
                      the stem a learned reduction of each pattern's bins at its own position.
    scan_shape:       (scan_y, scan_x) of the scan layout; S = scan_y * scan_x.
    physics_inputs:   K calibrated maps computed from the same stack (``com_y``, ``com_x``: centre
                      of mass, 1/Angstrom; ``icom``: integrated CoM, V*Angstrom; see
                      `stage.physics_inputs`) that travel as K extra (P, P) planes after the S
                      patterns: the input is (B, S + K, P, P). The patterns layout takes them as
                      K more channels; the scan layout resamples them to the scan grid and
                      appends them to the binned-pattern channels.
    icom_residual:    output channel (the potential's) that adds the iCoM input plane, gated: the
                      head predicts one more map ``g`` and that channel becomes ``head + (1 + g) *
                      gain * icom`` (``gain`` learned, started at the ratio of the plane's and the
                      target's standardisations), so the network starts from the classical answer
                      and learns where and how much to correct it (channelling, noise); -1 = off.
    padding_mode:     what every spatial conv (R x R dense layers, a stem kernel > 1, a transposed
                      conv with tu_kernel > tu_stride) sees beyond the image edge: ``zeros``, or
                      ``circular``: the opposite edge. Circular suits the scan layout, whose image
                      axes are the probe positions over exactly one period of the specimen; then a
                      periodic shift of the scan by a multiple of `size_multiple` shifts the maps.
                      Cards written before this key existed get ``zeros`` (their weights were).
    """

    in_channels: int
    out_channels: int
    init_channels: int
    init_bias: bool
    growth_rate: int
    kernel_size: int
    levels: int
    layers_per_block: tuple[int, ...]
    td_channels: tuple[int, ...] | None
    skip: bool
    dense_bn: bool
    td_bn: bool
    bn_affine: bool
    pool: str
    tu_kernel: int
    tu_stride: int
    dropout: float
    head_input: str
    input_layout: str = "patterns"
    pattern_bins: int = 0
    scan_shape: tuple[int, int] = (0, 0)
    stem_kernel: int = 0
    physics_inputs: tuple[str, ...] = ()
    icom_residual: int = -1
    padding_mode: str = "zeros"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["physics_inputs"] = list(self.physics_inputs)
        data["layers_per_block"] = list(self.layers_per_block)
        data["td_channels"] = None if self.td_channels is None else list(self.td_channels)
        data["scan_shape"] = list(self.scan_shape)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Architecture":
        """The inverse of `to_dict` (a model card's ``architecture``); cards written before the
        scan layout existed lack its three keys and get the patterns layout, and cards written
        before ``padding_mode`` existed get zeros padding (the dataclass defaults)."""
        data = dict(data)
        for key in ("layers_per_block", "td_channels", "scan_shape", "physics_inputs"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)

    @property
    def size_multiple(self) -> int:
        """The network's spatial sizes (pattern px, or scan positions in the scan layout) must be
        a multiple of this (every level divides by tu_stride)."""
        return self.tu_stride ** self.levels

    @property
    def stem_channels(self) -> int:
        """Input channels of the first conv: S patterns, or pattern_bins^2 binned pattern pixels,
        plus the K physics input maps."""
        base = self.in_channels if self.input_layout == "patterns" else self.pattern_bins ** 2
        return base + len(self.physics_inputs)

    @property
    def head_channels(self) -> int:
        """Maps the head predicts: one per target, plus the iCoM gate with ``icom_residual``."""
        return self.out_channels + (1 if self.icom_residual >= 0 else 0)

    @property
    def input_planes(self) -> int:
        """Planes of the network's input stack: S patterns + K physics maps."""
        return self.in_channels + len(self.physics_inputs)

    def data_mismatch(self, patterns: int, pattern_px: int, target_px: int | None,
                      scan_shape: tuple[int, int] | None = None) -> DataMismatch | None:
        """Why data of ``patterns`` patterns of ``pattern_px`` px with ``target_px`` targets, taken
        over a ``scan_shape`` = (scan_y, scan_x) scan, cannot train this network (what differs and the
        setting to change), or None if it can. ``target_px`` / ``scan_shape`` None check the input
        alone (what a forward pass sees: a stack of patterns, not where they were taken). The one
        owner of these rules: the pipeline config, the training data check and the card ask here."""
        m = self.size_multiple
        if patterns != self.in_channels:
            return DataMismatch(f"the data has {patterns} patterns per sample but the model expects in_channels="
                                f"{self.in_channels}", f"set model.in_channels={patterns} or simulate a matching scan")
        if self.input_layout == "patterns":
            if pattern_px % m:
                return DataMismatch(f"pattern_px={pattern_px} is not a multiple of {m} (tu_stride^levels)",
                                    "change simulation.pattern_px or lower model.levels")
            if target_px is not None and target_px != pattern_px:
                return DataMismatch(f"the patterns layout maps (S, P, P) to (C, P, P), but targets are {target_px} px "
                                    f"and patterns {pattern_px} px",
                                    "set simulation.target_px = pattern_px, or model.input_layout: scan")
            return None
        if min(self.scan_shape) % m:
            return DataMismatch(f"scan {list(self.scan_shape)} is not a multiple of {m} (tu_stride^levels) on both "
                                "axes", "change simulation.scan_shape or lower model.levels")
        if pattern_px % self.pattern_bins:
            return DataMismatch(f"pattern_px={pattern_px} is not a multiple of model.pattern_bins={self.pattern_bins}",
                                f"choose pattern_bins dividing {pattern_px}")
        if target_px is not None and self.scan_shape != (target_px, target_px):
            return DataMismatch(f"the scan layout maps a {self.scan_shape[0]}x{self.scan_shape[1]} scan to maps of "
                                f"the same size, but targets are {target_px}x{target_px}",
                                "set simulation.target_px to the scan size")
        if scan_shape is not None and tuple(scan_shape) != self.scan_shape:
            return DataMismatch(f"model.scan_shape {list(self.scan_shape)} differs from simulation.scan_shape "
                                f"{list(scan_shape)}", "set model.scan_shape to the simulated scan")
        return None


@dataclass(frozen=True)
class DataMismatch:
    """Why data does not fit a network (`Architecture.data_mismatch`): ``reason``, what differs, and
    ``advice``, the setting to change; ``str()`` is the one line a user reads."""

    reason: str
    advice: str

    def __str__(self) -> str:
        return f"{self.reason}; {self.advice}"


class ModelConfig(BaseModel):
    """The reconstructor network: a preset plus optional overrides (None = the preset's value).

    ``targets`` picks the output channels, in order: ``["potential"]`` (V*Angstrom),
    ``["density"]`` (electrons/Angstrom^2) or both. See `Architecture` for each override.
    """

    model_config = ConfigDict(extra="forbid")

    preset: PresetName = "small"
    targets: list[TargetName] = Field(default_factory=lambda: ["potential"])
    in_channels: int | None = Field(None, ge=1)
    init_channels: int | None = Field(None, ge=1)
    init_bias: bool | None = None
    growth_rate: int | None = Field(None, ge=1)
    kernel_size: int | None = Field(None, ge=1)
    levels: int | None = Field(None, ge=0)
    layers_per_block: list[int] | None = None
    td_channels: list[int] | None = None
    skip: bool | None = None
    dense_bn: bool | None = None
    td_bn: bool | None = None
    bn_affine: bool | None = None
    pool: Literal["avg", "max"] | None = None
    tu_kernel: int | None = Field(None, ge=1)
    tu_stride: int | None = Field(None, ge=2)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    head_input: Literal["all", "new"] | None = None
    input_layout: Literal["patterns", "scan"] | None = None
    pattern_bins: int | None = Field(None, ge=1)
    scan_shape: tuple[int, int] | None = None
    stem_kernel: int | None = Field(None, ge=0)
    physics_inputs: list[PhysicsInputName] | None = None   # None (like []): no physics input channels
    # the potential starts from the iCoM input plane and the network learns its correction
    # (Architecture.icom_residual); needs "icom" in physics_inputs and "potential" in targets
    icom_residual: bool | None = None   # None (like false): off
    padding_mode: Literal["zeros", "circular"] | None = None

    @field_validator("targets")
    @classmethod
    def _targets_unique(cls, value: list[str]) -> list[str]:
        if not value or len(set(value)) != len(value):
            raise ValueError(f"targets {value} must be a non-empty list of distinct names from ('potential', 'density')")
        return value

    @field_validator("physics_inputs")
    @classmethod
    def _physics_unique(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"physics_inputs {value} names a channel twice; list each of com_y, com_x, icom once")
        return value

    def architecture(self) -> Architecture:
        """The preset with this config's overrides applied, checked for consistency."""
        values = dict(PRESETS[self.preset])
        for name in Architecture.__dataclass_fields__:
            override = getattr(self, name, None)
            if override is not None:
                values[name] = tuple(override) if isinstance(override, list) else override
        if values.get("input_layout") == "scan":
            values.setdefault("pattern_bins", 16)
            values["scan_shape"] = values.get("scan_shape") or _square_scan(values["in_channels"])
        if self.icom_residual:
            if "potential" not in self.targets or "icom" not in (values.get("physics_inputs") or ()):
                raise ModelConfigError("model.icom_residual needs 'potential' in model.targets and 'icom' in "
                                       "model.physics_inputs (the plane it starts from); add them or turn it off")
        values["icom_residual"] = self.targets.index("potential") if self.icom_residual else -1
        arch = Architecture(out_channels=len(self.targets), **values)
        check_architecture(arch)
        return arch


def _square_scan(patterns: int) -> tuple[int, int]:
    side = math.isqrt(patterns)
    if side * side != patterns:
        raise ModelConfigError(f"model.in_channels={patterns} patterns is not a square scan; set model.scan_shape "
                               "to the scan's [scan_y, scan_x] for the scan layout")
    return (side, side)


def check_architecture(arch: Architecture) -> None:
    kernels = {"kernel_size": arch.kernel_size, "stem_kernel": arch.stem_kernel or arch.kernel_size}
    for name, size in kernels.items():
        if size % 2 == 0:
            raise ModelConfigError(f"model.{name}={size} must be odd ('same' padding keeps the size)")
    if len(arch.layers_per_block) != 2 * arch.levels + 1 or min(arch.layers_per_block) < 1:
        raise ModelConfigError(
            f"model.layers_per_block={list(arch.layers_per_block)} needs 2 * levels + 1 = {2 * arch.levels + 1} "
            f"positive numbers (encoder blocks, bottleneck, decoder blocks) for levels={arch.levels}")
    if arch.input_layout == "scan" and arch.scan_shape[0] * arch.scan_shape[1] != arch.in_channels:
        raise ModelConfigError(f"model.scan_shape={list(arch.scan_shape)} holds {arch.scan_shape[0] * arch.scan_shape[1]} "
                               f"positions but model.in_channels={arch.in_channels}; make them agree")
    if arch.td_channels is not None and (len(arch.td_channels) != arch.levels or min(arch.td_channels) < 1):
        raise ModelConfigError(f"model.td_channels={list(arch.td_channels)} needs one positive width per level "
                               f"({arch.levels}), or null to keep each input width")


class TrainConfig(BaseModel):
    """Training: optimiser, schedules, precision, batch, steps, cadence, device.

    optimizer:        ``larc_adam`` (the paper's), ``lamb`` (trust ratio on Adam's update),
                      ``adam``, ``adamw`` (decoupled weight decay instead of the L2 loss term).
    larc_mode, trust_coefficient: LARC ``clip`` (factor min(eta ||w|| / ||g||, 1)) or ``scale``.
    lr0, warmup_steps, decay_every, decay_factor: linear warm-up over ``warmup_steps`` from
                      ``lr0`` to min(1, N * lr0) for N workers, then times ``decay_factor`` every
                      ``decay_every`` steps (staircase; 0 = never).
    huber_delta0, huber_decay: Huber delta = delta0 * decay ** epoch, on standardised targets
                      (``absolute``) or on residuals relative to each sample's target RMS (``relative``).
    loss_weighting:   ``absolute`` (the paper's: squared error on globally standardised targets, a
                      sample weighs as its amplitude squared) | ``relative`` (each sample's residual
                      over its own target's RMS: the relative L2 the evaluation scores, so a light
                      material's faint map weighs as much as a heavy one's); `models.losses.data_loss`.
    weight_decay:     L2 term 0.5 * weight_decay * sum(w^2) over all parameters (TF's l2_loss).
    precision:        ``fp32`` | ``bf16`` | ``fp16`` (autocast; fp16 with dynamic loss scaling from
                      ``loss_scale_init``, never below ``loss_scale_floor``, doubled after
                      ``loss_scale_growth_interval`` clean steps).
    batch_size:       samples per rank per step.
    max_steps, epochs: length of training; ``max_steps`` (if set) wins over ``epochs``.
    max_wall_s:       stop earlier once this many seconds of wall-clock time have passed since this
                      process's `fit` began (a resume counts only its own time); checked between
                      steps, agreed by every rank; the run then ends as at ``max_steps`` (dev
                      evaluation, best checkpoint exported). None = no limit.
    eval_every, checkpoint_every, log_every: cadence in steps; ``keep_last`` checkpoints are kept
                      besides the best; ``max_dev_batches`` caps a dev evaluation.
    seed:             initial weights, data order and dropout (namsa.random_streams.TrainingStream);
                      0 <= seed < 2**63 (numpy takes no negative seed; torch's 64-bit one overflows
                      above), as every seed of the config.
    device:           ``auto`` (CUDA when available) | ``cpu`` | ``cuda``.
    channels_last, compile, activation_checkpointing: GPU speed/memory knobs.
    max_nonfinite:    stop after this many Inf/NaN losses or gradients in a row (each is skipped).
    max_train_samples: use only the first N training samples (data-scaling studies); None = all.
    init_from:        ``pretrained:NAME``, a model folder or a run folder: start from that model's
                      weights and normaliser (fine-tuning on new data; `models.training.init_weights`);
                      the model section must resolve to its architecture. None = fresh weights.
    progress, tensorboard: the progress bar and TensorBoard event files.
    """

    model_config = ConfigDict(extra="forbid")

    optimizer: Literal["larc_adam", "lamb", "adam", "adamw"] = "larc_adam"
    larc_mode: Literal["clip", "scale"] = "clip"
    trust_coefficient: float = Field(0.02, gt=0, description="LARC eta (default as NVIDIA apex's LARC)")
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0)
    lr0: float = Field(1e-4, gt=0)
    warmup_steps: int = Field(0, ge=0)
    decay_every: int = Field(0, ge=0, description="staircase decay period in steps after warm-up (0 = never)")
    decay_factor: float = Field(0.5, gt=0, le=1)
    huber_delta0: float = Field(10.0, gt=0)
    huber_decay: float = Field(0.99, gt=0, le=1)
    loss_weighting: Literal["absolute", "relative"] = "absolute"
    weight_decay: float = Field(1e-4, ge=0)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    loss_scale_init: float = Field(2.0 ** 16, gt=0)
    loss_scale_floor: float = Field(1.0, gt=0)
    loss_scale_growth_interval: int = Field(2000, ge=1)
    batch_size: int = Field(2, ge=1)
    max_steps: int | None = Field(None, ge=1)
    epochs: int = Field(10, ge=1)
    max_wall_s: float | None = Field(None, gt=0)
    eval_every: int = Field(50, ge=1)
    checkpoint_every: int = Field(100, ge=1)
    keep_last: int = Field(3, ge=1)
    log_every: int = Field(10, ge=1)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    channels_last: bool = False
    compile: bool = False
    activation_checkpointing: bool = Field(False, description="recompute dense-layer inputs in the backward "
                                           "pass: less memory (larger batches), ~1 extra forward of compute")
    max_nonfinite: int = Field(5, ge=1)
    max_train_samples: int | None = Field(None, ge=1)
    init_from: str | None = Field(None, min_length=1, max_length=4096)
    max_dev_batches: int | None = Field(None, ge=1)
    progress: bool = True
    tensorboard: bool = True
