"""How big a simulation plan is, bounded from the config before anything is planned or simulated.

`namsa.plan_samples` expands materials x zone axes x variants into a list of specs and the
generator draws its recipes one by one; neither shows progress, so an absurd plan (a typo'd
``variants``, ``generator.count=1000000000``) would stall silently for hours. The upper bound here
needs no structure: it takes every listed material (82 for ``library``), every generated one,
every CIF file, the configured zone axes (``max_zone_axes`` when they are found automatically)
and the variants. The bytes a plan's samples occupy on disk are checked against the free space
where the stores go once the samples left to simulate are known (`check_disk`).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from namsa.errors import UserError

GB = 1e9
#: most samples one config may plan (the paper's data set is ~10^4; 10^6 stores ~4 TB at 64 px)
MAX_PLANNED_SAMPLES = 1_000_000
#: LMDB page, manifest and metadata overhead per stored sample (bytes, a generous estimate)
RECORD_OVERHEAD_BYTES = 8192
#: built-in library size when ``materials: library`` (namsa.library has 82 structures)
LIBRARY_SIZE_HINT = 82


class PlanTooLargeError(UserError):
    """The plan holds more samples than a run may plan, or than the disk can hold."""


def material_bound(sim: Any) -> int:
    """Most materials the plan can hold: listed + generated + CIF files (without loading any)."""
    listed = LIBRARY_SIZE_HINT if sim.materials == "library" else len(sim.materials)
    cifs = 0
    if sim.cif_dir and Path(sim.cif_dir).is_dir():
        cifs = sum(1 for _ in Path(sim.cif_dir).glob("*.cif"))
    return listed + int(sim.generator.count) + cifs


def sample_bound(sim: Any) -> tuple[int, str]:
    """(most samples the plan can hold, how that number is made up)."""
    axes = sim.max_zone_axes if sim.zone_axes == "auto" else min(len(sim.zone_axes), sim.max_zone_axes)
    variants = sim.variants if sim.variations.any else 1
    materials = material_bound(sim)
    return materials * axes * variants, f"{materials} materials x {axes} zone axes x {variants} variants"


def stored_bytes(sim: Any, data: Any) -> float:
    """Bytes one stored sample occupies: the CBED stack in ``data.cbed_dtype`` and two float32 maps."""
    scan_y, scan_x = sim.scan_shape
    cbed_itemsize = 2 if getattr(data, "cbed_dtype", "float32") == "float16" else 4
    return float(scan_y * scan_x * sim.pattern_px ** 2 * cbed_itemsize + 2 * sim.target_px ** 2 * 4
                 + RECORD_OVERHEAD_BYTES)


def plan_problem(sim: Any, data: Any) -> str | None:
    """Why the config's plan is too large to plan at all (None when it is not)."""
    count, parts = sample_bound(sim)
    if count <= MAX_PLANNED_SAMPLES:
        return None
    return (f"the plan holds up to {count} samples ({parts}), whose stores would take about "
            f"{count * stored_bytes(sim, data) / GB:.3g} GB; one run plans at most {MAX_PLANNED_SAMPLES}: lower "
            f"simulation.variants, simulation.max_zone_axes or simulation.generator.count")


def free_bytes(path: str | Path) -> tuple[float, Path]:
    """(free bytes, the existing directory measured) on the file system that will hold ``path``;
    infinite on a pseudo file system of no size (/proc, /sys), where the write itself will fail
    with the system's own reason."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return (float(usage.free) if usage.total else float("inf")), probe


def check_disk(sim: Any, data: Any, n_samples: int, out_dir: str | Path) -> None:
    """Raise a one-line `PlanTooLargeError` when ``n_samples`` new samples cannot fit the free space."""
    if n_samples <= 0:
        return
    need = n_samples * stored_bytes(sim, data)
    free, where = free_bytes(out_dir)
    if need <= free:
        return
    fits = max(int(free // stored_bytes(sim, data)), 0)
    raise PlanTooLargeError(
        f"simulation: {n_samples} samples of {stored_bytes(sim, data) / 1e6:.3g} MB each need about "
        f"{need / GB:.3g} GB but {where} has {free / GB:.3g} GB free (room for {fits}); free space, write the "
        f"stores elsewhere (--out, execution.data_dir), or plan fewer samples (simulation.variants, "
        f"max_zone_axes, generator.count)")

