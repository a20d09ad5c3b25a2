"""How much memory one simulated sample needs, estimated from the config before anything runs.

An absurd size (a 100000 x 100000 scan, a grid of billions of pixels) must be refused in a second
with what fits, not found out by a MemoryError after planning or by an OOM kill. The estimate is
a lower bound from the sizes the config fixes (the grid is at least the smallest one
`namsa.sampling.config_sampling` says the config allows, ``grid_px[0]`` pixels per side):

* the CBED stack: S = scan_y * scan_x float32 patterns of pattern_px^2, held twice while the
  batches are concatenated and converted;
* the wave batch: at least one probe per thread on the full grid, 12 bytes per pixel on either
  path (namsa.scan_simulation._prepare: the periodic path's float32 pattern and its reduced copy; the
  multislice path's complex64 wave and float32 intensity are more).

The potential slices are not part of the bound: the periodic path builds them for one unit cell,
not the whole supercell, and the multislice path checks them against ``memory_budget_gb`` itself
(namsa.multislice.plan_batch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import psutil

from namsa.config import SimulationConfig
from namsa.sampling import config_sampling

GB = 1e9
#: bytes per grid pixel of one probe in flight (lower bound over both simulation paths)
PROBE_BYTES_PER_PX = 12
#: copies of the float32 CBED stack alive at once (the batches and their concatenation)
CBED_COPIES = 2


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
    return float(CBED_COPIES * scan_y * scan_x * cfg.pattern_px ** 2 * 4)


def sample_memory(cfg: SimulationConfig, threads: int = 1) -> SampleMemory:
    """Lower bound of the memory (bytes) simulating one sample of ``cfg`` needs on ``threads`` threads."""
    side = config_sampling(cfg).grid_px[0]  # the smallest grid the config allows (namsa's own rounding)
    return SampleMemory(cbed=cbed_bytes(cfg), waves=float(max(1, threads) * side ** 2 * PROBE_BYTES_PER_PX))


def largest_square_scan(cfg: SimulationConfig, free_bytes: float) -> int:
    """Side of the largest square scan whose CBED stack fits ``free_bytes``."""
    per_pattern = CBED_COPIES * cfg.pattern_px ** 2 * 4
    return int(math.isqrt(max(int(free_bytes // per_pattern), 0)))


def machine_memory() -> tuple[float, float]:
    """(total, available) memory of this machine in bytes."""
    vm = psutil.virtual_memory()
    return float(vm.total), float(vm.available)


def cbed_problem(cfg: SimulationConfig, total_bytes: float) -> str | None:
    """Why one sample's CBED stack cannot exist on a machine of ``total_bytes`` (None if it can)."""
    need = cbed_bytes(cfg)
    if need <= total_bytes:
        return None
    side = largest_square_scan(cfg, total_bytes / 2)  # advise a stack that leaves half the machine free
    return (f"one sample's CBED stack ({cfg.scan_shape[0]}x{cfg.scan_shape[1]} patterns of "
            f"{cfg.pattern_px}x{cfg.pattern_px} float32, held twice) needs {need / GB:.3g} GB but this machine has "
            f"{total_bytes / GB:.3g} GB in all; use a scan of at most {side}x{side} at this pattern_px "
            f"(the paper's is 32x32) or smaller patterns")


def check_fits(cfg: SimulationConfig, parallel: int = 1) -> None:
    """Raise a one-line `MemoryBudgetError` (a `namsa.errors.MemoryShortage`: the kind of running out
    of memory later too) unless ``parallel`` samples of ``cfg`` at once fit the memory this machine
    has available, and their ``memory_budget_gb`` (on the CPU) fits the machine."""
    from namsa.multislice import MemoryBudgetError

    total, available = machine_memory()
    problem = cbed_problem(cfg, total)
    if problem:
        raise MemoryBudgetError(f"simulation: {problem}")
    if cfg.device == "cpu" and parallel * cfg.memory_budget_gb * GB > total:
        # namsa plans its batches against the budget: one the machine cannot hold ends in an OOM kill
        raise MemoryBudgetError(f"simulation.memory_budget_gb={cfg.memory_budget_gb:g} for each of {parallel} "
                                f"sample(s) at once is more than this machine's {total / GB:.3g} GB; set it to at "
                                f"most {math.floor(total / GB / parallel * 10) / 10:g}")
    need = sample_memory(cfg, cfg.workers or 1)
    if parallel * need.total <= available:
        return
    fits = int(available // need.total)
    advice = (f"run at most {fits} at once (execution.workers={fits})" if fits else
              f"shrink the grid ({config_sampling(cfg).grid_px[0]}^2 pixels: raise sampling_A or reduce "
              "cell_lateral_A) "
              f"or the scan (scan_shape, pattern_px)")
    raise MemoryBudgetError(f"simulation: {parallel} sample(s) at once need at least {parallel * need.total / GB:.3g} GB "
                            f"({need.parts()} each) but {available / GB:.3g} GB is available; {advice}")
