"""``--study-host`` of benchmarks/bench_simulate.py: the host work per sample of a config's own plan
(configs/gpu-study.yaml by default) on the device path, the store write included, against a modelled
HBM-bound device time, and the samples/s that leaves with k host threads under the GIL.

One fresh process reads the config's stored plan (`workflow.plan_cache`, planned and stored on a first
run), takes a spread of its samples in the order a `namsa simulate` worker takes them (the plan's
interleaved order, `workflow.data_runners.interleaved`): evenly spaced ones without frozen phonons and
evenly spaced ones with (at least a quarter, so both kinds are measured), runs one warm-up sample, then
each through the worker's own calls (`namsa.simulate.prepare_sample`, `run_prepared`, `StoreWriter.put`)
on the strict cupy stand-in (tests/strict_cupy.py). Time inside stand-in array operations is what a GPU
would do and is left out; the rest is host time, split by step by wrapping the functions those calls
make (a step's time excludes the steps inside it), plus a modelled 5 us per kernel launch.

GIL: steps whose time is numpy/BLAS/LMDB work on whole arrays (the host projection a periodic sample's
targets are made from, a periodic sample's probe phases, the float16 cast, statistics and LMDB commit of the
store write) release the GIL; every other step is counted as holding it, so the GIL-held time is an upper
bound. Per sample cycle, with P the host phase (pool threads), S the driving thread's work (the host side of
the device phase), W the store write (on a thread of its own, workflow.store_behind), G the GIL-held part of
all three and D the modelled device time: cycle(k) = max(D + S, P / k, W, G), and the cap is 1 / cycle(k)
over the plan's mix (the phonon share of the whole plan weighting the two kinds' means). GIL hand-overs,
real cupy launch costs (above 5 us for many calls) and the pool threads' contention are not modelled.
"""
from __future__ import annotations

import functools
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from simulate_device_model import FFT_PASSES, H100_HBM_BPS, HOST_THREADS, LAUNCH_S, bytes_per_slice_per_probe

ROOT = Path(__file__).resolve().parents[1]
#: (module, attribute, step): the functions the worker's calls make, timed as steps (a class method as
#: "module:Class.method"); the phases themselves are the outermost steps
STEPS = (("namsa.structure_io", "load_structure", "structure"),
         ("namsa.supercell", "orient_supercell", "supercell"),
         ("namsa.simulate", "phonon_configurations", "phonon_configs"),
         ("namsa.simulate", "prepare_simulation", "prepare"),
         ("namsa.scan_simulation", "_transmissions", "potential_transmission"),
         ("namsa.scan_simulation", "build_periodic", "periodic_smatrix"),
         ("namsa.scan_simulation", "build_potential", "projection_host"),
         ("namsa.simulate", "pattern_rebinner", "rebinner"),
         ("namsa.simulate", "projected_potential_map", "targets"),
         ("namsa.simulate", "projected_density_map", "targets"),
         ("namsa.periodic:_StackedClasses.of", None, "periodic_stack"),
         ("namsa.periodic:_StackedClasses.intensities", None, "periodic_phases"),
         ("stage.writer", "_scaled_float16", "store_float16"),
         ("stage.writer", "sample_statistics", "store_stats"),
         ("stage.codec", "encode_record", "store_encode"),
         ("stage.writer:StoreWriter._commit", None, "store_commit"))
#: steps of whole-array numpy / BLAS / LMDB work, which release the GIL (a periodic sample's probe phases were an
#: einsum and a complex exp over (classes, probes, beams) on the host; now made on the device, little host is left)
GIL_FREE = ("projection_host", "periodic_phases", "store_float16", "store_stats", "store_commit")
#: the three phases of a sample in the worker loop, and the thread each runs on (the store write on one of its
#: own beside the next sample's device phase: workflow.store_behind)
PHASES = {"host_phase": "pool", "device_phase": "driving", "store_write": "store"}


class StepClock:
    """Exclusive host seconds and stand-in calls per (phase, step): a step's wall time less the stand-in's
    device time, less the host time of the steps inside it (a stack of open steps; the outermost one
    names the phase)."""

    def __init__(self, device_clock):
        self.device = device_clock
        self.stack: list[list] = []
        self.host: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}

    def wrap(self, step: str, func):
        @functools.wraps(func)
        def timed(*args, **kwargs):
            return self.run(step, func, *args, **kwargs)
        return timed

    def run(self, step: str, func, *args, **kwargs):
        key = (self.stack[0][0] if self.stack else step, step)
        frame = [step, time.perf_counter(), self.device.seconds, self.device.calls, 0.0, 0]
        self.stack.append(frame)
        try:
            return func(*args, **kwargs)
        finally:
            self.stack.pop()
            host = time.perf_counter() - frame[1] - (self.device.seconds - frame[2])
            calls = self.device.calls - frame[3]
            self.host[key] = self.host.get(key, 0.0) + host - frame[4]
            self.calls[key] = self.calls.get(key, 0) + calls - frame[5]
            if self.stack:
                self.stack[-1][4] += host
                self.stack[-1][5] += calls


def install(clock: StepClock) -> None:
    """Wrap every function of `STEPS` where the worker's calls look it up."""
    for where, name, step in STEPS:
        if ":" in where:
            module, attr = where.split(":")
            owner, name = getattr(importlib.import_module(module), attr.split(".")[0]), attr.split(".")[1]
            if isinstance(owner.__dict__[name], classmethod):   # wrapped as the function it binds
                func = owner.__dict__[name].__func__
                setattr(owner, name, classmethod(clock.wrap(step, func)))
                continue
        else:
            owner = importlib.import_module(where)
        setattr(owner, name, clock.wrap(step, getattr(owner, name)))


def device_model_s(info: dict, n_positions: int) -> dict:
    """Modelled HBM seconds of one sample (H100, 1 / 2 memory passes per FFT). Multislice: every probe
    through every slice (`bytes_per_slice_per_probe`). Periodic: every beam through the tile's slices,
    the exit waves read once, and per probe its waves written and read back and its intensities written
    (8 + 8 + 8 bytes a pixel)."""
    n_pixels = info["gpts"][0] * info["gpts"][1]
    if info["method"] == "multislice":
        rays, pixels, extra = n_positions, n_pixels, 0
    else:
        tile = info["tile_gpts"][0] * info["tile_gpts"][1]
        rays, pixels, extra = info["n_beams"], tile, info["n_beams"] * tile * 8 + n_positions * n_pixels * 24
    return {f"{p}_pass_fft": (rays * info["n_slices"] * bytes_per_slice_per_probe(pixels, p) + extra) / H100_HBM_BPS
            for p in FFT_PASSES}


def chosen_specs(sim_cfg, specs: list, count: int) -> tuple[list, float]:
    """``count`` specs spread over the worker's order, a quarter (at least 2) with frozen phonons, and the
    plan's phonon share."""
    from namsa.variations import sample_seed, uses_frozen_phonon

    phonon = [uses_frozen_phonon(sim_cfg, sample_seed(sim_cfg, s.material_id, s.zone_axis, s.variant)) for s in specs]
    with_ph = [s for s, p in zip(specs, phonon) if p]
    without = [s for s, p in zip(specs, phonon) if not p]
    n_ph = min(len(with_ph), max(2, count // 4))

    def spread(items: list, n: int) -> list:
        return [items[int(i)] for i in np.linspace(0, len(items) - 1, n)] if n else []

    return spread(without, count - n_ph) + spread(with_ph, n_ph), float(np.mean(phonon))


def sample_row(clock: StepClock, spec, source: str, sim_cfg, writer, infos: list) -> dict:
    """One sample through the worker's three calls: its host seconds by phase and step (kernel launches
    at `LAUNCH_S` each as a step of their own), per thread, GIL-held, and its modelled device time."""
    from namsa.simulate import prepare_sample, run_prepared

    clock.host.clear()
    clock.calls.clear()
    prepared = clock.run("host_phase", prepare_sample, source, spec.zone_axis, sim_cfg, spec.variant)
    sample = clock.run("device_phase", run_prepared, prepared, sim_cfg)
    clock.run("store_write", writer.put, sample)
    steps = {f"{phase}/{step}": s for (phase, step), s in clock.host.items()}
    for phase in PHASES:
        steps[f"{phase}/launches"] = LAUNCH_S * sum(n for (p, _), n in clock.calls.items() if p == phase)
    thread = {t: sum(s for k, s in steps.items() if PHASES[k.split("/")[0]] == t) for t in ("pool", "driving", "store")}
    gil_free = sum(s for k, s in steps.items() if k.split("/")[1] in GIL_FREE)
    meta = sample.meta
    return {"sample": f"{meta.material_id} {list(meta.zone_axis)}", "method": meta.method, "gpts": list(meta.gpts),
            "n_slices": meta.n_slices, "atoms": len(prepared.configurations[0].numbers),
            "thickness_A": round(meta.thickness_A, 1), "frozen_phonon": meta.frozen_phonon, "steps_s": steps,
            "pool_s": thread["pool"], "driving_s": thread["driving"], "store_s": thread["store"],
            "gil_held_s": sum(thread.values()) - gil_free,
            "device_s": device_model_s(infos[-1], len(prepared.positions))}


def study_child(config: str, count: int, plan_dir: str) -> None:
    """Runs in a fresh process: the spread of ``config``'s plan (see the module docstring); prints JSON."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import strict_cupy

    sys.modules.update(strict_cupy.modules())
    from workflow.config import load_config
    from workflow.data_runners import interleaved, open_free_writer
    from workflow.plan_cache import cached_plan

    cfg = load_config(str(ROOT / "configs" / f"{config}.yaml"), ["simulation.device=cuda"])
    sim_cfg = cfg.simulation
    plan, _ = cached_plan(sim_cfg, plan_dir)
    order = interleaved(plan.specs)
    specs, phonon_share = chosen_specs(sim_cfg, order[1:], count)
    clock = StepClock(strict_cupy.DeviceClock)
    install(clock)
    infos: list[dict] = []
    import namsa.simulate as simulate

    simulate.prepare_simulation = _capturing(simulate.prepare_simulation, infos)
    with tempfile.TemporaryDirectory() as out:
        writer = open_free_writer(Path(out) / "store-000", sim_cfg.physics_hash(), cfg.data)
        sample_row(clock, order[0], plan.sources[order[0].material_id], sim_cfg, writer, infos)   # warm-up
        rows = [sample_row(clock, s, plan.sources[s.material_id], sim_cfg, writer, infos) for s in specs]
        writer.close()
    print(json.dumps({"config": config, "plan_samples": len(order), "phonon_share": phonon_share,
                      "host_threads_config": sim_cfg.host_threads, "rows": rows,
                      "caps": samples_per_s_caps(rows, phonon_share)}))


def _capturing(prepare, infos: list):
    """prepare_simulation that also records the Simulation's info (the device model needs its grid)."""
    @functools.wraps(prepare)
    def capture(*args, **kwargs):
        sim = prepare(*args, **kwargs)
        infos.append(sim.info)
        return sim
    return capture


def plan_mean(rows: list[dict], phonon_share: float, value) -> float:
    """The mean of ``value(row)`` over the plan's mix: the two kinds' means weighted by the phonon share."""
    kinds = {ph: [value(r) for r in rows if r["frozen_phonon"] == ph] for ph in (False, True)}
    weights = {False: 1.0 - phonon_share, True: phonon_share}
    present = {ph: w for ph, w in weights.items() if kinds[ph]}
    return sum(w * float(np.mean(kinds[ph])) for ph, w in present.items()) / sum(present.values())


def samples_per_s_caps(rows: list[dict], phonon_share: float) -> dict:
    """Per FFT-pass count and host thread count k: samples/s = 1 / max(D + S, P / k, W, G) over the plan's mix
    (module docstring) and which term bounds it."""
    pool, driving, store, gil = (plan_mean(rows, phonon_share, lambda r, key=key: r[key])
                                 for key in ("pool_s", "driving_s", "store_s", "gil_held_s"))
    caps = {"pool_s": pool, "driving_s": driving, "store_s": store, "gil_held_s": gil}
    for passes in (f"{p}_pass_fft" for p in FFT_PASSES):
        device = plan_mean(rows, phonon_share, lambda r: r["device_s"][passes])
        caps[f"device_s[{passes}]"] = device
        for k in HOST_THREADS:
            terms = {"device + driving thread": device + driving, f"host phase / {k}": pool / k, "store thread": store,
                     "GIL": gil}
            bound = max(terms, key=terms.get)
            caps[f"k={k}[{passes}]"] = {"samples_per_s": 1.0 / terms[bound], "bound": bound}
    return caps


def study_host(config: str, count: int, plan_dir: str, in_fresh_process) -> dict:
    """Runs the child in a fresh process and prints its per-sample table and the caps."""
    out = in_fresh_process(["--study-child", config, str(count), plan_dir])
    steps = sorted({k for r in out["rows"] for k in r["steps_s"]}, key=lambda k: (list(PHASES).index(k.split("/")[0]), k))
    print(f"[{config}] {len(out['rows'])} of the plan's {out['plan_samples']} samples (frozen-phonon share of the "
          f"plan {out['phonon_share']:.1%}); host seconds per step, phase/step:", flush=True)
    print("| sample | method, grid, slices, atoms | thickness A, phonons | " + " | ".join(steps)
          + " | pool | driving | store | GIL-held | device 1/2-pass |")
    for r in out["rows"]:
        print(f"| {r['sample']} | {r['method']} {r['gpts'][0]}x{r['gpts'][1]}, {r['n_slices']}, {r['atoms']} | "
              f"{r['thickness_A']}, {'yes' if r['frozen_phonon'] else 'no'} | "
              + " | ".join(f"{r['steps_s'].get(k, 0.0):.4f}" for k in steps)
              + f" | {r['pool_s']:.3f} | {r['driving_s']:.3f} | {r['store_s']:.3f} | {r['gil_held_s']:.3f} | "
              f"{r['device_s']['1_pass_fft']:.4f} / {r['device_s']['2_pass_fft']:.4f} |")
    for s in steps:
        mean = plan_mean(out["rows"], out["phonon_share"], lambda r: r["steps_s"].get(s, 0.0))
        print(f"  plan-weighted mean {s}: {mean:.4f} s")
    caps = out["caps"]
    print(f"plan-weighted: host phase (pool) {caps['pool_s']:.3f} s, driving thread {caps['driving_s']:.3f} s, "
          f"store thread {caps['store_s']:.3f} s, GIL-held {caps['gil_held_s']:.3f} s, device {caps['device_s[1_pass_fft]']:.4f} / "
          f"{caps['device_s[2_pass_fft]']:.4f} s (1 / 2 passes per FFT)")
    launches = plan_mean(out["rows"], out["phonon_share"],
                         lambda r: sum(v for k, v in r["steps_s"].items() if k.endswith("/launches"))) / LAUNCH_S
    print(f"  {launches:.0f} kernel launches a sample (GIL-held): at 10 / 20 us each instead of "
          f"{LAUNCH_S * 1e6:.0f} us the GIL-held time is {caps['gil_held_s'] + launches * (10e-6 - LAUNCH_S):.3f} / "
          f"{caps['gil_held_s'] + launches * (20e-6 - LAUNCH_S):.3f} s")
    for k in HOST_THREADS:
        print(f"  host_threads={k}: " + "; ".join(
            f"{p}-pass {caps[f'k={k}[{p}_pass_fft]']['samples_per_s']:.1f} samples/s "
            f"(bound: {caps[f'k={k}[{p}_pass_fft]']['bound']})" for p in FFT_PASSES), flush=True)
    return out
