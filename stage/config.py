"""`DataConfig`: how samples are stored, split, normalised and loaded.

One pydantic section of the pipeline config (``data:`` in the YAML files). Every field has a
default, so ``DataConfig()`` is a working configuration for a CPU laptop.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from namsa.constants import MIN_DOSE_E_PER_A2
from namsa.errors import UserError
from namsa.random_streams import MAX_SEED

from .splits import SplitBy


def expand_path(text: str, key: str) -> Path:
    """A configured path with ``$VARS`` and ``~`` expanded where this process runs (a job's
    ``$TMPDIR``, ``$SCRATCH``); a variable that is not set here is a `UserError` naming ``key``,
    not a directory literally called ``$TMPDIR``."""
    expanded = os.path.expandvars(str(text))
    if "$" in expanded:
        raise UserError(f"{key} {text!r} names an environment variable that is not set here ({expanded!r}); "
                        "set it in the job script or give a path")
    return Path(expanded).expanduser()

#: paper split: 90/5/5 train/dev/test (Laanait et al. 2019, Sec. 3).
DEFAULT_SPLIT_FRACTIONS: tuple[float, float, float] = (0.90, 0.05, 0.05)


def a_probability(value: float, name: str) -> float:
    """``value`` itself when it lies in [0, 1]; else a ValueError naming the field ``name``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} {value} is a probability: give a number in [0, 1]")
    return value


class DoseAugmentationConfig(BaseModel):
    """Shot noise drawn in the loader at a random dose, on the training split only (`stage.dose`).

    enabled:             off by default: samples are delivered exactly as stored.
    dose_range_e_per_A2: [low, high] electron dose (electrons per Angstrom^2), low <= high, low at least
                         `namsa.constants.MIN_DOSE_E_PER_A2`; the issue's span of real doses is 1e2-1e6.
    log_uniform:         draw the dose log-uniformly over the range (every decade equally often);
                         False draws it uniformly.
    clean_fraction:      probability that a sample is delivered noise-free (infinite dose) instead.
    seed:                with the epoch and the sample id, fixes every dose and every noise draw.
    on_device:           draw the Poisson counts on the training device (torch) instead of in the
                         loader (numpy): the loader delivers the clean stored patterns, the training
                         step draws the noise on the batch's device before the input transform. The
                         doses are the host path's; the counts follow the same law but are other
                         draws (`stage.device_noise`). False (the default): the host path.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    dose_range_e_per_A2: tuple[float, float] = (1e2, 1e6)
    log_uniform: bool = True
    clean_fraction: float = 0.1
    seed: int = Field(0, ge=0, le=MAX_SEED)
    on_device: bool = False

    @field_validator("dose_range_e_per_A2")
    @classmethod
    def _positive_ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not (0 < low <= high < float("inf")):
            raise ValueError(f"dose range {list(value)} must be [low, high] electrons/A^2 with 0 < low <= high, "
                             "e.g. [100, 1000000]")
        if low < MIN_DOSE_E_PER_A2:  # the model's card could not state it (models.card_statistics)
            raise ValueError(f"dose range {list(value)} starts below {MIN_DOSE_E_PER_A2:g} electron/A^2, where a "
                             "pattern holds less than one electron: start it at 1 or more, e.g. [100, 1000000]")
        return value

    @field_validator("clean_fraction")
    @classmethod
    def _a_probability(cls, value: float, info: ValidationInfo) -> float:
        return a_probability(value, info.field_name)


class CameraAugmentationConfig(BaseModel):
    """Training samples seen through an integrating (scintillator-coupled) camera, drawn after the
    Poisson electrons of the dose augmentation (`stage.camera_augmentation`), on the training split only.

    What `namsa reconstruct` hands the network from such a camera (namsa.camera's model, the counts
    restored by stage.microscope.counts_restore): the Poisson electrons blurred by the scintillator's
    point spread, plus read (dark) noise, the dark level subtracted and negatives set to 0, each tile
    divided by its mean total. A sample drawn for the camera gets exactly that, in the model's pattern
    pixels; the others stay counted (a direct detector: Merlin/Medipix3, K3 or Arina counting, and
    EMPAD, whose pixels neither spread the charge nor add read noise worth an electron).

    enabled:              off by default: samples are delivered as the dose augmentation leaves them.
                          Needs ``dose_augmentation.enabled`` (the camera records its Poisson electrons).
    integrating_fraction: probability that a sample drawn with a dose is seen through the camera;
                          clean samples (no dose) and samples simulated with noise are left as they are.
    psf_sigma_px:         [low, high] Gaussian point-spread sigma in the MODEL's pattern pixels, drawn
                          uniformly. A camera whose detector pixels are b times finer than the model's (the
                          rebin of `namsa reconstruct` sums b x b of them into one) has sigma_model =
                          sigma_detector / b.
    read_noise_e:         [low, high] read noise (Gaussian, zero-mean after the dark reference) in
                          electrons per MODEL pattern pixel, drawn uniformly: the camera's read noise in
                          counts over its gain (counts per electron), per detector pixel r; summing b x b
                          detector pixels in software makes it b * r per model pixel, binning on the chip
                          before read-out keeps it r.
    seed:                 with the epoch and the sample id, fixes every camera draw (own stream).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    integrating_fraction: float = 0.5
    # Defaults at the rates of real scintillator cameras at 1x binning: a Gaussian core of ~1 detector
    # pixel (R. R. Meyer and A. I. Kirkland, Microsc. Res. Tech. 49 (2000) 269, fibre-coupled CCDs at
    # 200-300 kV; namsa.camera's default and the scintillator of benchmarks/bench_camera_noise.py), and a
    # read noise of a few counts at a gain of ~10 counts per electron (0.1-0.5 e; the benchmark's 2 counts at
    # gain 10 is 0.2 e). Direct counting detectors have neither: they are the (1 - fraction) left counted.
    psf_sigma_px: tuple[float, float] = (0.5, 1.5)
    read_noise_e: tuple[float, float] = (0.05, 0.5)
    seed: int = Field(0, ge=0, le=MAX_SEED)

    @field_validator("integrating_fraction")
    @classmethod
    def _a_probability(cls, value: float, info: ValidationInfo) -> float:
        return a_probability(value, info.field_name)

    @field_validator("psf_sigma_px", "read_noise_e")
    @classmethod
    def _ordered(cls, value: tuple[float, float], info: ValidationInfo) -> tuple[float, float]:
        low, high = value
        unit = "model pattern pixels" if info.field_name == "psf_sigma_px" else "electrons per pixel"
        if not (0.0 <= low <= high < float("inf")):
            raise ValueError(f"{info.field_name} {list(value)} must be [low, high] {unit} with 0 <= low <= high, "
                             f"e.g. {list(CameraAugmentationConfig.model_fields[info.field_name].default)}")
        return value


class SymmetryAugmentationConfig(BaseModel):
    """The square group's 8 rotations/mirrors applied together to scan, patterns and targets of
    training samples, drawn in the loader (`stage.symmetry`).

    enabled: off by default: samples are delivered exactly as stored.
    seed:    with the epoch and the sample id, fixes which operation each sample gets.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    seed: int = Field(0, ge=0, le=MAX_SEED)


class DataConfig(BaseModel):
    """Store format, splits, input normalisation and loader knobs.

    cbed_dtype:        dtype of stored CBED intensities; float16 halves disk and I/O and is exact
                       enough for intensities in [0, 1] (relative error 2^-11).
    compression:       ``none`` or ``zstd`` (zstd over byte-shuffled CBED bytes, lossless).
                       Default chosen by benchmarks/bench_io.py (see benchmarks/RESULTS.md).
    compression_level: zstd level (1 = fastest).
    split_fractions:   (train, dev, test) fractions, assigned per material (never per sample).
    split_seed:        seed of the hash-based material -> split assignment; 0 <= seed < 2**63, as every
                       seed of the config (numpy takes no negative seed, torch no seed above 64 bits).
    split_by:          ``material`` (default, the study's split): every sample of a material in one
                       split; ``prototype``: every material of a structure type in one split, so
                       dev and test hold structure types training never saw
                       (`namsa.structure_type.prototype_label`; docs/store-format.md, "Splits").
    transform:         input transform applied to each pattern after subtracting its minimum:
                       ``none`` | ``log1p`` | ``sqrt``; the result is then standardised.
    num_workers, prefetch_factor, pin_memory: loader knobs (pin_memory only has an effect when
                       CUDA is available). With ``loader: threads`` num_workers is the number of
                       reader threads (0 = read in the calling thread) and prefetch_factor the
                       number of batches read ahead.
    loader:            ``processes``: torch DataLoader worker processes, every item in freshly
                       allocated shared memory; ``threads``: reader threads filling a fixed ring
                       of preallocated (pinned with CUDA) batch buffers, no allocation in steady
                       state; ``auto``: threads when one delivered cbed stack is at least
                       ``stage.loader.THREADS_MIN_SAMPLE_BYTES`` (128 KiB; every study- or
                       paper-shaped sample), processes otherwise. See docs/store-format.md, "Loader".
    shard_mode:        ``unique``: each rank reads its own stores (node-local shards, the paper's
                       mode); ``shared``: all ranks read all stores through a DistributedSampler.
    node_local_dir:    node-local storage (e.g. ``$TMPDIR``, NVMe; variables expanded): set, each
                       training rank stages its own shard of the data there and reads only that
                       (`stage.stage_rank_shard`); None = every rank reads the data dirs directly.
    map_size_mb:       initial LMDB map size; it doubles automatically when full.
    max_map_size_gb:   the map never grows beyond this; reaching it is a clear error.
    manifest_every_s:  a writer refreshes manifest.json at least this often (seconds); the
                       manifest is also rewritten on close and rebuilt from LMDB on open.
    dose_augmentation: Poisson shot noise drawn in the loader at a random dose for training
                       samples (`DoseAugmentationConfig`; off by default).
    symmetry_augmentation: rotations/mirrors of scan, patterns and targets together for training
                       samples (`SymmetryAugmentationConfig`; off by default).
    camera_augmentation: a share of the noisy training samples seen through an integrating camera
                       (point spread, read noise, clipped at 0: `CameraAugmentationConfig`; off by
                       default; needs dose_augmentation).
    resident:          hold the training and dev splits in the training device's memory (`stage.resident`):
                       the store is read once (checksums verified) into one tensor in the stored dtype,
                       and each step gathers its batch by index there and draws the symmetry
                       operation, the shot noise and the input transform on the device, so a step
                       does no host work but launching. The same batches, in the same order, as the
                       streaming loader for a seed; the doses and operations are the host path's
                       per (seed, epoch, sample id) and the noise is always drawn on the device
                       (``dose_augmentation.on_device`` is implied). Refused with one line
                       (`namsa.errors.MemoryShortage`) before anything is read when the splits do not
                       fit the device's free memory with a quarter kept; not with
                       ``model.physics_inputs``. False (the default): the streaming loader above.
    light_oversample:  each training sample of a light material (every element Z <= 14,
                       `namsa.kirkland.is_light`) is drawn this many times per epoch, each copy
                       with its own noise and symmetry draws (1 = as stored). Light materials are
                       few in generated data (8% of the study's) and their maps mostly their mean,
                       which a network that rarely sees them underestimates.
    """

    model_config = ConfigDict(extra="forbid")

    cbed_dtype: Literal["float16", "float32"] = "float16"
    compression: Literal["none", "zstd"] = "none"
    compression_level: int = Field(1, ge=1, le=19)
    split_fractions: tuple[float, float, float] = DEFAULT_SPLIT_FRACTIONS
    split_seed: int = Field(0, ge=0, le=MAX_SEED)
    split_by: SplitBy = "material"
    transform: Literal["none", "log1p", "sqrt"] = "log1p"
    num_workers: int = Field(2, ge=0)
    prefetch_factor: int = Field(2, ge=1)
    pin_memory: bool = True
    loader: Literal["auto", "processes", "threads"] = "auto"
    shard_mode: Literal["unique", "shared"] = "unique"
    node_local_dir: str | None = None
    map_size_mb: int = Field(256, ge=1)
    max_map_size_gb: float = Field(4096.0, gt=0)
    manifest_every_s: float = Field(30.0, gt=0)
    dose_augmentation: DoseAugmentationConfig = DoseAugmentationConfig()
    symmetry_augmentation: SymmetryAugmentationConfig = SymmetryAugmentationConfig()
    camera_augmentation: CameraAugmentationConfig = CameraAugmentationConfig()
    light_oversample: int = Field(1, ge=1, le=16)
    resident: bool = False

    @field_validator("split_fractions")
    @classmethod
    def _fractions_sum_to_one(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(f < 0 for f in value) or abs(sum(value) - 1.0) > 1e-6:
            raise ValueError(f"split_fractions {value} must be three non-negative numbers summing to 1")
        return value

    @model_validator(mode="after")
    def _camera_needs_dose(self) -> "DataConfig":
        if self.camera_augmentation.enabled and not self.dose_augmentation.enabled:
            raise ValueError("data.camera_augmentation records the Poisson electrons of data.dose_augmentation: "
                             "enable data.dose_augmentation too, or disable data.camera_augmentation")
        return self
