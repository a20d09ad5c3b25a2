"""Device calls per sample: how many array operations (kernel launches, FFTs, copies) the simulator's
CUDA path issues for one sample of a config, counted on the strict cupy stand-in (tests/strict_cupy.py)
on a CPU. At the study's size a sample is ~20 ms of GPU work, so at ~5-10 us per launch the call count,
not the arithmetic, bounds the periodic path: this is the figure that batching the Bloch classes cuts.

    python benchmarks/bench_device_calls.py [--config study] [--samples 6] [--json OUT]

Each sample is simulated in this process with ``device: cuda`` on the stand-in (no GPU involved, no time
measured); the figure is the count itself, the same on every machine for the same code. The samples are
the first ``--samples`` library samples of the config's plan whose method is the periodic path (the
frozen-phonon ones run probe by probe and are counted apart, with ``--multislice``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _config(name: str, **changes):
    import yaml

    from namsa.config import SimulationConfig

    fields = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())["simulation"]
    fields.update(materials=fields.get("materials", "library"), generator={"count": 0}, device="cuda", **changes)
    return SimulationConfig(**fields)


def count_calls(config: str, samples: int, multislice: bool) -> list[dict]:
    """Per sample: its id, method, grid and device-call count on the stand-in."""
    sys.path.insert(0, str(ROOT / "tests"))
    import strict_cupy

    sys.modules.update(strict_cupy.modules())
    from namsa.plan import plan_samples
    from namsa.simulate import simulate_sample

    cfg = _config(config, variations={**_config(config).variations.model_dump(),
                                      "frozen_phonon_fraction": 1.0 if multislice else None,
                                      "frozen_phonon": multislice})
    rows = []
    plan = plan_samples(cfg)
    for spec in plan.specs:
        strict_cupy.DeviceClock.reset()
        sample = simulate_sample(plan.sources.get(spec.material_id, spec.material_id), spec.zone_axis, cfg,
                                 spec.variant)
        rows.append({"sample_id": sample.id, "method": sample.meta.method, "calls": strict_cupy.DeviceClock.calls,
                     "gpts": sample.meta.gpts, "thickness_A": sample.meta.thickness_A})
        print(f"{sample.id}: {sample.meta.method}, {rows[-1]['calls']} device calls", flush=True)
        if len(rows) == samples:
            break
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="study")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--multislice", action="store_true", help="frozen-phonon samples (probe-by-probe path)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = count_calls(args.config, args.samples, args.multislice)
    calls = sorted(r["calls"] for r in rows)
    print(f"{args.config}: {len(rows)} samples, device calls per sample: median {calls[len(calls) // 2]}, "
          f"min {calls[0]}, max {calls[-1]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
