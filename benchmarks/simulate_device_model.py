"""The device side of benchmarks/bench_simulate.py: the HBM-bandwidth bound of the multislice kernel
(bytes per slice per probe, one or two passes per FFT; the copy bandwidth a GPU measures) and the
host time of the device path against it (``--host-vs-device``: one sample of a config's sizes on
the strict cupy stand-in, its host steps, and the modelled device wait with k host threads).
Imported by bench_simulate.py, which runs the fresh processes; see its docstring for the method.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

import numpy as np


#: passes over memory per 2-D FFT: one (the whole transform in shared memory / cache) or two (a row
#: pass and a column pass, as cuFFT does for large 2-D sizes)
FFT_PASSES = (1, 2)
#: an H100 SXM's HBM3 bandwidth (bytes/s), the bound the issue's goal is stated against
H100_HBM_BPS = 3.35e12


def bytes_per_slice_per_probe(n_pixels: int, fft_passes: int) -> int:
    """HBM bytes per slice per probe of the multislice kernel (complex64 wave, 8 bytes/pixel): the
    transmission and propagator multiplies read + write the wave (16 N each), each of the two FFTs
    reads + writes it ``fft_passes`` times (16 N per pass); the shared transmission function and
    propagator reads are amortised over the batch and left out, so the bound is optimistic."""
    return (2 * 16 + 2 * fft_passes * 16) * n_pixels


def hbm_bound_s(n_pixels: int, n_slices: int, n_positions: int, bandwidth: float) -> dict:
    """Modelled device seconds of one sample's multislice at the bandwidth bound, per FFT-pass count."""
    return {f"{p}_pass_fft": n_positions * n_slices * bytes_per_slice_per_probe(n_pixels, p) / bandwidth
            for p in FFT_PASSES}


def gpu_bound(gpts: int, n_slices: int, device: str) -> dict:
    """Copy bandwidth of the device (GB/s) and the multislice kernel's bandwidth bound (patterns/s)
    with one and with two passes per FFT (:func:`bytes_per_slice_per_probe`)."""
    import cupy

    n_bytes = 1 << 30
    a = cupy.empty(n_bytes // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    cupy.copyto(b, a)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(10):
        cupy.copyto(b, a)
    cupy.cuda.Device().synchronize()
    bandwidth = 2 * n_bytes * 10 / (time.perf_counter() - start)   # read + write
    bound = {"copy_bandwidth_GBps": bandwidth / 1e9}
    for p in FFT_PASSES:
        per_pattern = bytes_per_slice_per_probe(gpts * gpts, p) * n_slices
        bound[f"bound_patterns_per_s[{p}_pass_fft]"] = bandwidth / per_pattern
    return bound


#: kernel launches cost host time even when they overlap the GPU's work (cupy: ~5-10 us each)
LAUNCH_S = 5e-6


def host_child(config: str, fft_friendly: bool, material: str, zone_axis: tuple[int, int, int], repeats: int) -> None:
    """Runs in a fresh process: one sample of ``config``'s sizes through the device path on the strict
    cupy stand-in; prints JSON with its host seconds by step and the modelled HBM-bound device seconds."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tests"))
    import strict_cupy

    sys.modules.update(strict_cupy.modules())
    from namsa.config import SimulationConfig
    from namsa.detector import pattern_rebinner
    from namsa.library import get
    from namsa.multislice import shift_phases_on
    from namsa.optics import scan_positions
    from namsa.simulate import resolve_fov
    from namsa.scan_simulation import prepare_simulation
    from namsa.supercell import orient_supercell
    from namsa.targets import projected_density_map, projected_potential_map, target_fwhm_A
    from namsa.variations import phonon_configurations, sample_seed, specimen_thickness_A

    fields = yaml.safe_load((root / "configs" / f"{config}.yaml").read_text())["simulation"]
    cfg = SimulationConfig(**{**fields, "device": "cuda", "fft_friendly_grid": fft_friendly})
    host: dict[str, float] = {}
    clock = strict_cupy.DeviceClock

    def timed(step: str, func):
        clock.reset()
        start = time.perf_counter()
        result = func()
        host[step] = time.perf_counter() - start - clock.seconds
        launches = "pool_launches" if step in POOL_STEPS else "launches"   # issued by the thread that ran it
        host[launches] = host.get(launches, 0.0) + clock.calls * LAUNCH_S
        return result

    warm: list[dict] = []
    for variant in range(repeats + 1):   # sample 0 warms up (imports, caches)
        host.clear()
        seed = sample_seed(cfg, material, list(zone_axis), variant)
        rng = np.random.default_rng(seed)
        cell = timed("supercell", lambda: phonon_configurations(
            orient_supercell(get(material), zone_axis, cfg.cell_lateral_A, specimen_thickness_A(cfg, seed)),
            cfg, rng, seed)[0])
        fov = resolve_fov(cfg, cell.cell_A)
        pos = scan_positions(fov, cfg.scan_shape)
        sim = timed("prepare", lambda: prepare_simulation(
            cell, energy_kv=cfg.energy_kv, semiangle_mrad=cfg.semiangle_mrad, sampling_A=cfg.sampling_A,
            gpts=cfg.gpts, slice_thickness_A=cfg.slice_thickness_A, band_limit=cfg.band_limit, device="cuda",
            n_positions=len(pos), memory_budget_gb=cfg.memory_budget_gb, fft_friendly_grid=fft_friendly))
        timed("rebinner", lambda: pattern_rebinner(sim.grid, cfg.band_limit, cfg.pattern_px, sim.backend))
        fwhm = target_fwhm_A(sim.grid, fov, cfg.target_px, cfg.energy_kv, cfg.semiangle_mrad)
        # the targets' Gaussian and GEMMs run on the device (namsa.targets with a GPU backend)
        timed("targets", lambda: (projected_potential_map(sim.potential, fov, cfg.target_px, fwhm, sim.backend),
                                  projected_density_map(sim.potential, fov, cfg.target_px, fwhm, sim.backend)))
        stack = timed("stack", lambda: _prefaulted((len(pos), cfg.pattern_px, cfg.pattern_px)))
        timed("phase_ramps", lambda: shift_phases_on(sim.backend, pos, sim.grid.gpts, sim.grid.sampling))
        # what the host does with the patterns (simulate._run_configuration): each batch copied out of
        # the pinned staging buffer into the sample's pre-faulted (S, P, P) stack
        staged = np.ones((sim.batch_size, cfg.pattern_px, cfg.pattern_px), np.float32)
        sizes = [min(sim.batch_size, len(pos) - i) for i in range(0, len(pos), sim.batch_size)]
        timed("patterns_home", lambda: _patterns_home(staged, sizes, stack))
        host["launches"] = host.get("launches", 0.0) + -(-len(pos) // sim.batch_size) * sim.info["n_slices"] * 4 * LAUNCH_S   # 2 multiplies + 2 FFTs
        if variant:
            warm.append(dict(host))
    # per step the least disturbed of the warm samples (the machine is shared: load only adds time)
    steps = {step: min(h[step] for h in warm) for step in warm[0]}
    best = {"host_s": steps, "host_total_s": sum(steps.values())}
    device = hbm_bound_s(sim.grid.gpts[0] * sim.grid.gpts[1], sim.info["n_slices"], len(pos), H100_HBM_BPS)
    pool = sum(best["host_s"][step] for step in POOL_STEPS)
    serial = best["host_total_s"] - pool
    print(json.dumps({"config": config, "fft_friendly_grid": fft_friendly, "material": material,
                      "gpts": sim.grid.gpts, "n_slices": sim.info["n_slices"], "positions": len(pos),
                      "batch_size": sim.batch_size, "atoms": len(cell.numbers), "warm_samples": repeats, **best,
                      "hbm_bound_s": device,
                      "host_fraction": {k: best["host_total_s"] / v for k, v in device.items()},
                      "pool_s": pool, "serial_s": serial,
                      "pipelined": {str(k): pipelined_wait(pool, serial, device, k, len(sizes))
                                    for k in HOST_THREADS}}))


#: the host phase (namsa.simulate.prepare_sample), run ahead on the pool's threads; the rest
#: (phase ramps, patterns home, kernel launches) is on the thread that drives the device
POOL_STEPS = ("supercell", "prepare", "rebinner", "targets", "stack", "pool_launches")
#: host threads per worker the bench reports (simulation.host_threads)
HOST_THREADS = (1, 2, 3, 4)
#: configs/gpu-node.yaml: 16 cores and 4 GPUs, one simulation worker per GPU, so 4 cores per worker:
#: one drives the device, at most 3 run host threads in parallel (more only take turns on them)
CORES_PER_GPU = 4


def pipelined_wait(pool_s: float, serial_s: float, device: dict, host_threads: int, batches: int) -> dict:
    """Modelled device wait per sample with ``host_threads`` preparing ahead: the serial host work
    on the driving thread, the GIL taken back after each of its two device syncs per batch (worst
    case: a whole namsa.pipelined.GIL_SWITCH_S each), plus whatever the pool cannot deliver in one
    cycle (device + serial seconds) with min(host_threads, CORES_PER_GPU - 1) cores; as seconds and
    fraction of the device time."""
    from namsa.pipelined import GIL_SWITCH_S

    cores = min(host_threads, CORES_PER_GPU - 1)
    serial_s += 2 * batches * GIL_SWITCH_S
    out = {}
    for passes, device_s in device.items():
        wait = serial_s + max(0.0, pool_s / cores - (device_s + serial_s))
        out[passes] = {"wait_s": wait, "fraction": wait / device_s}
    return out


def _prefaulted(shape: tuple[int, ...]) -> np.ndarray:
    """The sample's stack as simulate.prepare_configuration makes it on a GPU: every page touched."""
    stack = np.empty(shape, np.float32)
    stack.fill(0.0)
    return stack


def _patterns_home(staged: np.ndarray, sizes: list[int], stack: np.ndarray) -> np.ndarray:
    """Each batch copied out of the pinned staging buffer into its rows of the sample's stack."""
    for start, n in zip(np.cumsum([0, *sizes[:-1]]), sizes):
        stack[start:start + n] = staged[:n]
    return stack


def host_vs_device(configs: list[str], repeats: int, in_fresh_process: Callable[[list[str]], dict]) -> list[dict]:
    """Per config, with its own fft_friendly_grid and with it off, each in a fresh process
    (``in_fresh_process``: bench_simulate's, which runs its ``--host-child``)."""
    import yaml

    rows = []
    for config in configs:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", f"{config}.yaml")
        on = bool(yaml.safe_load(open(path))["simulation"].get("fft_friendly_grid", False))
        for fft_friendly in dict.fromkeys((on, False)):
            row = in_fresh_process(["--host-child", config, str(int(fft_friendly)), str(repeats)])
            rows.append(row)
            steps = ", ".join(f"{k} {v:.3f}" for k, v in row["host_s"].items())
            waits = "; ".join(f"k={k}: " + " / ".join(f"{w['wait_s']:.3f} s = {w['fraction']:.1%}" for w in per.values())
                              for k, per in row["pipelined"].items())
            print(f"[{config}, fft_friendly_grid={fft_friendly}] grid {row['gpts']} x {row['n_slices']} slices, "
                  f"{row['atoms']} atoms, {row['positions']} positions: host {row['host_total_s']:.3f} s ({steps}); "
                  f"host phase (pool) {row['pool_s']:.3f} s, driving thread {row['serial_s']:.3f} s; H100 HBM bound "
                  f"{row['hbm_bound_s']['1_pass_fft']:.3f} s (1 pass/FFT) / {row['hbm_bound_s']['2_pass_fft']:.3f} s "
                  f"(2 passes/FFT); device wait with the pipeline (1 / 2 passes): {waits}", flush=True)
    return rows
