"""The memory simulating one sample takes: namsa's one model of it. The simulator plans its probe
batches with it (`namsa.multislice.plan_batch`, `namsa.scan_simulation`), and the check before a run
(`workflow.memory.check_fits`) asks `sample_memory` instead of estimating on its own.

Per probe in flight and grid pixel, a batch holds at its peak (bytes):

* multislice path, `MULTISLICE_BYTES_PER_PROBE_PIXEL` = 32: the complex64 wave (8), the FFT's work
  area or out-of-place result (8: cuFFT's in-place work area is at most the data's size), the
  band-limited exit wave (8), the float32 intensity (4) and the imag**2 temporary (4). Measured, not
  guessed: on the strict cupy stand-in a batch's marginal peak is 24-28 (tests/test_device_path.py,
  which fails if a change makes it exceed this); on a GPU the memory pool (cuFFT plans and their work
  areas included) is measured by tests/test_multislice.py's gpu test.
* periodic path, `PERIODIC_BYTES_PER_PROBE_PIXEL` = 12: the float32 intensity on the whole grid (4)
  and the complex64 exit waves it is summed from (8: `namsa.periodic.PeriodicSimulation.intensities`
  builds them one Bloch class at a time, and the classes split the grid's pixels between them).

Before a run the path is not known (it is chosen per structure, `namsa.scan_simulation`), so the
estimate of a sample takes the smaller figure (`MIN_BYTES_PER_PROBE_PIXEL`) on the smallest grid the
config allows (`namsa.sampling.config_sampling`): a lower bound. The CBED stack is float32 and held
twice while the batches are concatenated and converted (`CBED_COPIES`).

The potential slices are not part of the estimate: the periodic path builds them for one unit cell,
not the whole supercell, and the multislice path checks them against ``memory_budget_gb`` itself
(`namsa.multislice.plan_batch`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .sampling import config_sampling

if TYPE_CHECKING:
    from .config import SimulationConfig

GB = 1e9
#: bytes per probe and grid pixel of a multislice batch at its peak (see the module docstring)
MULTISLICE_BYTES_PER_PROBE_PIXEL = 32
#: bytes per probe and grid pixel of a periodic (S-matrix) batch (see the module docstring)
PERIODIC_BYTES_PER_PROBE_PIXEL = 12
#: the least either path holds per probe and pixel: what an estimate made before the path is chosen can promise
MIN_BYTES_PER_PROBE_PIXEL = min(MULTISLICE_BYTES_PER_PROBE_PIXEL, PERIODIC_BYTES_PER_PROBE_PIXEL)
#: bytes of one stored CBED value (float32)
CBED_BYTES_PER_VALUE = 4
#: copies of the float32 CBED stack alive at once (the batches and their concatenation)
CBED_COPIES = 2

#: the two simulation paths (`namsa.scan_simulation`)
SimulationPath = Literal["multislice", "periodic"]
_PER_PIXEL: dict[str, int] = {"multislice": MULTISLICE_BYTES_PER_PROBE_PIXEL, "periodic": PERIODIC_BYTES_PER_PROBE_PIXEL}


def bytes_per_probe(gpts: tuple[int, int], path: SimulationPath = "multislice") -> int:
    """Working memory (bytes) of one probe in a batch of ``path`` on a grid of ``gpts`` pixels."""
    return gpts[0] * gpts[1] * _PER_PIXEL[path]


@dataclass(frozen=True)
class SampleMemory:
    """Bytes simulating one sample needs, by part (lower bounds)."""

    cbed: float
    waves: float

    @property
    def total(self) -> float:
        return self.cbed + self.waves

    def parts(self) -> str:
        return f"CBED stack {self.cbed / GB:.3g} GB, wave batch {self.waves / GB:.3g} GB"


def cbed_bytes(cfg: SimulationConfig) -> float:
    """The float32 CBED stack of one sample, with its transient copy (bytes)."""
    scan_y, scan_x = cfg.scan_shape
    return float(scan_y * scan_x * _pattern_bytes(cfg))


def sample_memory(cfg: SimulationConfig, threads: int = 1) -> SampleMemory:
    """Lower bound of the memory (bytes) simulating one sample of ``cfg`` needs on ``threads``
    threads: its CBED stack and at least one probe per thread on the smallest grid it allows."""
    side = config_sampling(cfg).grid_px[0]
    return SampleMemory(cbed=cbed_bytes(cfg), waves=float(max(1, threads) * side ** 2 * MIN_BYTES_PER_PROBE_PIXEL))


def largest_square_scan(cfg: SimulationConfig, free_bytes: float) -> int:
    """Side of the largest square scan whose CBED stack fits ``free_bytes``."""
    return int(math.isqrt(max(int(free_bytes // _pattern_bytes(cfg)), 0)))


def _pattern_bytes(cfg: SimulationConfig) -> int:
    """Bytes one pattern of the CBED stack takes, its copies counted."""
    return CBED_COPIES * cfg.pattern_px ** 2 * CBED_BYTES_PER_VALUE


__all__ = ["SampleMemory", "sample_memory", "cbed_bytes", "largest_square_scan", "bytes_per_probe",
           "MULTISLICE_BYTES_PER_PROBE_PIXEL", "PERIODIC_BYTES_PER_PROBE_PIXEL", "MIN_BYTES_PER_PROBE_PIXEL",
           "CBED_BYTES_PER_VALUE", "CBED_COPIES", "GB"]
