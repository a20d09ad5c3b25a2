"""Whether a simulation fits this machine, checked from the config before anything runs.

An absurd size (a 100000 x 100000 scan, a grid of billions of pixels) must be refused in a second
with what fits, not found out by a MemoryError after planning or by an OOM kill. What one sample
needs is namsa's own model of it (`namsa.sample_memory`: the CBED stack and the wave batch, a lower
bound); here it is held against the machine's memory (`machine_memory`) and the advice is written.
"""
from __future__ import annotations

import math

import psutil

from namsa.config import SimulationConfig
from namsa.sample_memory import GB, cbed_bytes, largest_square_scan, sample_memory
from namsa.sampling import config_sampling


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
