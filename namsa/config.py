"""SimulationConfig: every physical parameter of a simulated sample, plus the dataset plan.

Units are in the field names (kV, mrad, Angstrom, mm, GB). Arrays follow [row = y, col = x].
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .constants import MIN_DOSE_E_PER_A2
from .generator import GeneratorConfig
from .random_streams import MAX_SEED
from .sample import config_hash

#: most potential slices one sample may need (thickness over slice thickness): the paper's
#: specimens need a few hundred; more is a typo that would run for days
MAX_SLICES = 10_000

#: bump when the simulator's physics changes in a way that changes samples (part of physics_hash, so of
#: every sample id and store): 2 = the Gaussian targets of stated resolution (namsa.targets, version 2),
#: so a store written with the old hard-cutoff targets is refused for new samples, never mixed with them;
#: 3 = one stream per random draw (namsa.random_streams: the phonon configurations no longer reuse the
#: thickness and shot-noise streams)
PHYSICS_SCHEMA = 3


class Aberrations(BaseModel):
    """Probe aberrations. ``C1_A`` is the C1,0 coefficient (Angstrom): chi = 2 pi/lambda (C1 a^2/2 +
    C3 a^4/4), so a negative C1 is underfocus (defocus = -C1, Kirkland's df). ``C3_mm`` is Cs (mm)."""

    model_config = ConfigDict(extra="forbid")
    C1_A: float = 0.0
    C3_mm: float = 0.0


class Variations(BaseModel):
    """Per-variant random variations, drawn from the sample's own seed.

    With every variation off, all variants would be identical, so ``plan_samples`` plans only
    variant 0 per (material, zone axis).
    """

    model_config = ConfigDict(extra="forbid")
    frozen_phonon: bool = False
    #: with ``frozen_phonon``: the fraction of samples drawn with thermal displacements (each sample
    #: decides from its own seed); None = every sample
    frozen_phonon_fraction: float | None = Field(None, ge=0.0, le=1.0)
    #: RMS thermal displacement (Angstrom, per Cartesian axis): one value for every element, a
    #: {symbol: value} map, or None for the per-element Debye-Waller defaults of namsa.thermal
    thermal_sigma_A: float | dict[str, float] | None = None
    #: maximum specimen tilt (mrad); each variant draws a tilt uniformly in the disc of this radius
    tilt_mrad: float = Field(0.0, ge=0.0, le=50.0)
    #: C1 (Angstrom) drawn uniformly from [lo, hi] and added to ``aberrations.C1_A``
    defocus_range_A: tuple[float, float] = (0.0, 0.0)
    #: specimen thickness (Angstrom) drawn uniformly from [lo, hi] instead of ``thickness_A``;
    #: None = always ``thickness_A``. The box still holds whole beam repeats (>= the drawn value).
    thickness_range_A: tuple[float, float] | None = None
    #: with ``thickness_range_A`` [lo, hi]: the share of samples whose thickness is drawn uniformly
    #: below ``thin_below_A`` (from [lo, thin_below_A)), the others uniformly from [thin_below_A, hi];
    #: each sample decides from its own seed (namsa.random_streams). None = uniform over [lo, hi]
    #: (and so is a one-value range lo = hi: every sample that thick)
    thin_fraction: float | None = Field(None, ge=0.0, le=1.0)
    #: the thickness (Angstrom) below which a sample counts as thin for ``thin_fraction``
    thin_below_A: float | None = Field(None, gt=0.0)
    #: expected electrons per Angstrom^2 of the scanned area; each pattern then holds Poisson counts
    #: (divided by the pattern's expected total, so the intensity scale is unchanged); None = no noise;
    #: at least `namsa.constants.MIN_DOSE_E_PER_A2`
    dose_e_per_A2: float | None = Field(None, gt=0.0)

    @field_validator("defocus_range_A", "thickness_range_A")
    @classmethod
    def _ordered(cls, v: tuple[float, float] | None, info) -> tuple[float, float] | None:
        if v is not None and v[0] > v[1]:
            raise ValueError(f"{info.field_name} must be (low, high) with low <= high, got {list(v)}")
        if v is not None and info.field_name == "thickness_range_A" and v[0] <= 0:
            raise ValueError(f"thickness_range_A must be positive (Angstrom), got {list(v)}")
        return v

    @field_validator("dose_e_per_A2")
    @classmethod
    def _a_dose_with_electrons(cls, v: float | None) -> float | None:
        if v is not None and not v >= MIN_DOSE_E_PER_A2:
            raise ValueError(f"dose_e_per_A2={v:g} is below {MIN_DOSE_E_PER_A2:g} electron/Angstrom^2, where a "
                             "pattern holds less than one electron at any probe step up to 1 A: give a dose of at "
                             "least that (low-dose work is tens of e/A^2), or null for noise-free patterns")
        return v

    @model_validator(mode="after")
    def _fraction_needs_phonons(self) -> "Variations":
        if self.frozen_phonon_fraction is not None and not self.frozen_phonon:
            raise ValueError(f"frozen_phonon_fraction={self.frozen_phonon_fraction} is the share of samples with "
                             "frozen phonons: set variations.frozen_phonon: true, or leave the fraction out")
        return self

    @model_validator(mode="after")
    def _thin_share_inside_the_range(self) -> "Variations":
        if (self.thin_fraction is None) != (self.thin_below_A is None):
            raise ValueError("thin_fraction (the share of thin samples) and thin_below_A (Angstrom) go together: "
                             f"set both, or neither (got thin_fraction={self.thin_fraction}, "
                             f"thin_below_A={self.thin_below_A})")
        lo, hi = self.thickness_range_A or (None, None)
        # a one-value range (a fixed thickness, e.g. a quick check) leaves no share to choose
        if self.thin_below_A is None or (lo is not None and lo == hi):
            return self
        if lo is None or not lo < self.thin_below_A < hi:
            raise ValueError(f"thin_below_A={self.thin_below_A:g} must lie inside variations.thickness_range_A "
                             f"{list(self.thickness_range_A) if self.thickness_range_A else '(not set)'}: set a "
                             "range [lo, hi] with lo < thin_below_A < hi, or leave thin_fraction and thin_below_A "
                             "out (null)")
        return self

    @property
    def any(self) -> bool:
        return (self.frozen_phonon or self.tilt_mrad > 0 or self.defocus_range_A[0] != self.defocus_range_A[1]
                or (self.thickness_range_A is not None and self.thickness_range_A[0] != self.thickness_range_A[1])
                or self.dose_e_per_A2 is not None)


#: Variations fields added after stores were first written (left out of physics_hash while None)
_LATER_VARIATIONS: tuple[str, ...] = ("thickness_range_A", "dose_e_per_A2", "frozen_phonon_fraction", "thin_fraction",
                                      "thin_below_A")


#: the fields of a simulation config that describe the machine it runs on, not the samples: left out of
#: the physics hash, and of a published card's config (workflow.pretrained), so that a card written on a
#: GPU node re-simulates its samples anywhere
MACHINE_FIELDS = ("device", "memory_budget_gb", "workers", "host_threads")


class SimulationConfig(BaseModel):
    """Physics of one 4D-STEM sample and the plan of which samples to simulate.

    Grid: give ``sampling_A`` (Angstrom/pixel) or ``gpts`` (pixels per side); ``gpts`` wins when both
    are set. The default 0.12 Angstrom keeps laptop runs cheap (~100-150 px grids) but bounds the
    patterns at ~70 mrad at 200 kV: through the default 40 Angstrom it keeps 97% of the probe
    intensity for Si [110] and 74% for SrTiO3 [001] (``meta.intensity_kept_min``); use
    0.05-0.06 Angstrom for quantitative work (>= 0.99 kept). The scanned field of view is ``scan_fov_A`` = [y0, x0, height, width] (Angstrom) when
    given, else the central ``scan_fov_fraction`` of the supercell.
    """

    model_config = ConfigDict(extra="forbid")

    # -- physics ------------------------------------------------------------------------------
    energy_kv: float = Field(200.0, gt=0.0, le=3000.0)
    semiangle_mrad: float = Field(20.0, gt=0.0, le=200.0)
    sampling_A: float | None = Field(0.12, gt=0.0)
    gpts: int | None = Field(None, ge=8)
    slice_thickness_A: float = Field(2.0, gt=0.0)
    scan_shape: tuple[int, int] = (32, 32)
    pattern_px: int = Field(32, ge=4)
    target_px: int = Field(32, ge=4)
    cell_lateral_A: float = Field(12.0, gt=0.0)
    thickness_A: float = Field(40.0, gt=0.0)
    scan_fov_fraction: float = Field(1.0, gt=0.0)
    scan_fov_A: tuple[float, float, float, float] | None = None
    aberrations: Aberrations = Aberrations()
    band_limit: float = Field(2.0 / 3.0, gt=0.0, le=1.0)
    variations: Variations = Variations()
    #: frozen-phonon configurations per sample: the patterns (and targets) are the mean over this
    #: many thermal configurations, as abTEM's FrozenPhonons averages them (needs
    #: ``variations.frozen_phonon``); 1 is one thermal snapshot per sample
    phonon_configs: int = Field(1, ge=1, le=1000)
    #: make every grid side a 2^a 3^b 5^c pixel count (namsa.potential.make_grid), as cuFFT and FFTW
    #: are fastest on those, when the grid comes from sampling_A (an explicit gpts is used as given);
    #: changes the grid, so the samples (part of the physics hash when on)
    fft_friendly_grid: bool = False
    seed: int = Field(0, ge=0, le=MAX_SEED)

    # -- execution (does not change a sample) ---------------------------------------------------
    device: str = "cpu"
    memory_budget_gb: float = Field(2.0, gt=0.0)
    workers: int | None = Field(None, ge=1)
    #: host threads that prepare the next samples (structure, supercell, potential, targets) while the
    #: current one runs (namsa.pipelined); on CPU 1 = one after the other, as the run uses every core;
    #: on a GPU at least one thread prepares ahead. Each holds one prepared sample in memory.
    host_threads: int = Field(1, ge=1, le=64)

    # -- dataset plan ---------------------------------------------------------------------------
    materials: list[str] | Literal["library"] = "library"
    cif_dir: str | None = None
    #: generated materials (library prototypes x element substitutions x lattice jitter), added to
    #: ``materials``; see namsa.generator
    generator: GeneratorConfig = GeneratorConfig()
    zone_axes: list[tuple[int, int, int]] | Literal["auto"] = "auto"
    max_zone_axes: int = Field(3, ge=1, le=100)
    variants: int = Field(1, ge=1, le=1_000_000)
    #: the first variant planned: variants first_variant .. first_variant + variants - 1 of every
    #: (material, zone axis). Each variant draws its own thickness, focus, tilt and phonons from its own
    #: seed, so a later run with a higher first_variant simulates fresh samples of the same materials and
    #: splits (scripts/gpu_study.sh: one more per link of the flagship's chain); part of the plan, not
    #: the physics (sample ids keep their config hash)
    first_variant: int = Field(0, ge=0, le=1_000_000)

    @field_validator("scan_shape")
    @classmethod
    def _scan_positive(cls, v: tuple[int, int]) -> tuple[int, int]:
        if min(v) < 1:
            raise ValueError(f"scan_shape must be two positive ints, got {v}")
        return v

    @field_validator("scan_fov_fraction")
    @classmethod
    def _fraction_inside(cls, v: float) -> float:
        if v > 1.0:
            raise ValueError(f"scan_fov_fraction={v} puts the scan outside the cell; use a value in (0, 1]")
        return v

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        if v != "cpu" and not (v == "cuda" or (v.startswith("cuda:") and v[5:].isdigit())):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {v!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SimulationConfig":
        if self.first_variant and not self.variations.any:
            raise ValueError(f"first_variant={self.first_variant} plans other variants, but with every variation "
                             "off all variants are one sample: turn a variation on, or first_variant: 0")
        if self.phonon_configs > 1 and not self.variations.frozen_phonon:
            raise ValueError(f"phonon_configs={self.phonon_configs} averages over frozen-phonon configurations: "
                             "set variations.frozen_phonon: true, or phonon_configs: 1")
        thickest = max(self.thickness_A, *(self.variations.thickness_range_A or (0.0, 0.0)))
        if thickest / self.slice_thickness_A > MAX_SLICES:
            raise ValueError(f"a {thickest:g} Angstrom specimen in {self.slice_thickness_A:g} Angstrom slices needs "
                             f"{thickest / self.slice_thickness_A:.3g} slices, more than {MAX_SLICES}; lower "
                             f"thickness_A (or variations.thickness_range_A) or raise slice_thickness_A")
        if self.sampling_A is None and self.gpts is None:
            raise ValueError("set sampling_A (Angstrom/pixel) or gpts (pixels per side)")
        if self.scan_fov_A is not None:
            y0, x0, h, w = self.scan_fov_A
            # the supercell is at least cell_lateral_A wide, so this fov always fits it
            if min(y0, x0) < 0 or h <= 0 or w <= 0 or y0 + h > self.cell_lateral_A or x0 + w > self.cell_lateral_A:
                raise ValueError(f"scan_fov_A={list(self.scan_fov_A)} must lie inside the "
                                 f"{self.cell_lateral_A} Angstrom cell: need y0, x0 >= 0 and y0 + height, "
                                 "x0 + width <= cell_lateral_A")
        return self

    def physics_hash(self) -> str:
        """sha256 over every field that changes a sample (not device, memory, workers, host_threads or the plan)."""
        payload = self.model_dump(mode="json", exclude={*MACHINE_FIELDS, "materials", "cif_dir", "generator",
                                                        "zone_axes", "max_zone_axes", "variants",
                                                        "first_variant"})
        # Keys added later enter the hash only when set, so earlier stores keep their ids.
        for key in _LATER_VARIATIONS:
            if payload["variations"][key] is None:
                del payload["variations"][key]
        if payload["phonon_configs"] == 1:   # one snapshot, as before the key existed
            del payload["phonon_configs"]
        if not payload["fft_friendly_grid"]:   # the grid as before the key existed
            del payload["fft_friendly_grid"]
        payload["physics_schema"] = PHYSICS_SCHEMA
        return config_hash(payload)
