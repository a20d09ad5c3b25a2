"""Before the GPU study run (scripts/gpu_study.sh): does namsa's CUDA path simulate a study sample as
the CPU does, and what bf16 matmul rate does this GPU reach (the reference that training's TFLOP/s is
read against, measured in the same run)? Writes JSON to --json (atomically: a check killed at its limit
leaves no file, not half of one) and prints it; exits 0 whatever cuda did: the JSON's ``cuda_ok`` tells
the script whether to fall back to simulating on the CPU. A config error is one line on stderr, exit 2,
and the JSON records it with ``cuda_ok`` null (unknown).

    python scripts/gpu_study_check.py CONFIG --json OUT.json
    python scripts/gpu_study_check.py --cuda-usable OUT.json   # exit 0: simulate on cuda (`cuda_usable`)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: how close the CUDA sample must be to the CPU one (float32 round-off is ~1e-6; tests use 1e-5)
MAX_REL_L2 = 1e-4


def _first_sample(config: str) -> tuple[Any, Any, dict[str, str]]:
    """The config's simulation physics on one thin library specimen, its first spec and the plan's sources."""
    from namsa.plan import plan_samples
    from workflow.config import load_config

    # one thin specimen of the study's physics: a quick check, not a sample of the plan
    sim = load_config(config, ["simulation.generator.count=0", "simulation.materials=[Si-diamond]",
                               "simulation.variations.thickness_range_A=[20,20]"]).simulation
    plan = plan_samples(sim)
    return sim, plan.specs[0], plan.sources


def cuda_against_cpu(config: str) -> dict[str, Any]:
    """One sample on cuda and on the CPU: their relative L2 and times, or why cuda failed."""
    from namsa.simulate import simulate_sample

    sim, spec, sources = _first_sample(config)
    source = sources.get(spec.material_id, spec.material_id)
    start = time.perf_counter()
    cpu = simulate_sample(source, spec.zone_axis, sim.model_copy(update={"device": "cpu"}), spec.variant)
    cpu_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        gpu = simulate_sample(source, spec.zone_axis, sim.model_copy(update={"device": "cuda"}), spec.variant)
        cuda_s = time.perf_counter() - start
    except Exception as exc:  # any cupy / driver failure means: simulate on the CPU instead
        return {"cuda_ok": False, "reason": f"{type(exc).__name__}: {exc}"[:300], "cpu_s": cpu_s}
    rel = float(np.linalg.norm(gpu.cbed - cpu.cbed) / np.linalg.norm(cpu.cbed))
    return {"cuda_ok": bool(rel < MAX_REL_L2 and gpu.id == cpu.id), "sample_id": cpu.id, "rel_l2": rel,
            "reason": "" if rel < MAX_REL_L2 else f"cuda differs from the CPU by {rel:.2e}",
            "cpu_s": cpu_s, "cuda_s_cold": cuda_s}


def bf16_matmul_tflops(n: int = 8192, repeats: int = 20) -> float | None:
    """Warm bf16 GEMM rate of this GPU (TFLOP/s), None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12


@dataclass(frozen=True)
class CheckVerdict:
    """check.json as the study reads it: ``cuda_ok`` true or false from a check that compared the two
    devices, None (with ``why_none``) when the file holds no verdict."""
    cuda_ok: bool | None
    why_none: str = ""


def read_verdict(check_json: Path) -> CheckVerdict:
    """The verdict of ``check_json``. Only a JSON boolean counts: a missing, empty, truncated or
    other-shaped file, a directory, a link, ``"false"`` as a string, or the null of a check that could
    not run (a config error) hold none."""
    from gpu_study_collect import read_object   # beside this file: the study's one bounded, no-follow reader

    notes: list[str] = []
    record = read_object(check_json.parent, check_json, notes)
    if notes:
        return CheckVerdict(None, notes[0])
    ok = record.get("cuda_ok")
    if isinstance(ok, bool):
        return CheckVerdict(ok)
    error = f" (the check: {str(record['error'])[:200]})" if record.get("error") else ""
    return CheckVerdict(None, f"its cuda_ok is {json.dumps(ok)[:40]}, not true or false{error}")


def cuda_usable(check_json: Path) -> bool:
    """Whether the study simulates on cuda: unless the check said ``cuda_ok: false``. A check that wrote
    nothing (it ran out of its time once: RESULTS.md, the second device run) or a damaged check.json is no
    evidence against cuda; one line on stderr says so."""
    verdict = read_verdict(check_json)
    if verdict.cuda_ok is None:
        print(f"gpu_study_check: {check_json} is no evidence against cuda ({verdict.why_none}); simulating on cuda",
              file=sys.stderr)
    return verdict.cuda_ok is not False


def run_check(config: str) -> tuple[dict[str, Any], int]:
    """The check's record and exit status: 2 with the error recorded (cuda_ok unknown) when the config is bad."""
    from namsa.errors import NamsaError

    try:
        sample, status = cuda_against_cpu(config), 0
    except NamsaError as exc:   # bad input: one line, and the record says why the check holds no verdict
        print(f"gpu_study_check: error: {exc}", file=sys.stderr)
        sample, status = {"cuda_ok": None, "error": str(exc)[:500]}, 2
    return {**sample, "bf16_matmul_tflops": bf16_matmul_tflops()}, status


def write_record(path: str, result: dict[str, Any]) -> int:
    """``result`` written to ``path`` whole or not at all; 0, or 2 with one line when it cannot be."""
    from stage.jsonfile import write_json_atomic

    try:
        write_json_atomic(path, result)
    except OSError as exc:
        print(f"gpu_study_check: cannot write --json {path} ({exc.strerror or exc}); give a writable file path",
              file=sys.stderr)
        return 2
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?")
    parser.add_argument("--json")
    parser.add_argument("--stand-in", action="store_true", help="rehearsal: the strict cupy stand-in, no GPU")
    parser.add_argument("--cuda-usable", type=Path, metavar="CHECK_JSON",
                        help="exit 0 when the study simulates on cuda")
    args = parser.parse_args()
    if args.cuda_usable:
        raise SystemExit(0 if cuda_usable(args.cuda_usable) else 1)
    if not (args.config and args.json):
        parser.error("CONFIG and --json are needed for the check")
    if args.stand_in:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import strict_cupy

        sys.modules.update(strict_cupy.modules())
    result, status = run_check(args.config)
    print(json.dumps(result))
    raise SystemExit(write_record(args.json, result) or status)


if __name__ == "__main__":
    main()
