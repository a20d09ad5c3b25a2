"""The field's-rule table of one or more `namsa evaluate` runs on the same held-out samples: potential
relative L2 per method, mean [95% interval, bootstrap over materials], overall, per element class and per
thickness class (< 50, 50-100, >= 100 A), and the network's level error median.

    python benchmarks/rescore_table.py runs/rescore-new-plan/eval-ptycho-gpu-study-h200 [EVAL ...]
        [--target potential] [--view field]

Each EVAL is an output folder of `namsa evaluate` (its metrics.json). Rows are the samples every given
run scored (so a network scored on all samples and ptychography on a subset are compared on the
subset); a method appears once, from the first run that has it, except the network, which appears for
each run (named after its folder).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluation.methods import NETWORK  # noqa: E402
from evaluation.metrics import bootstrap_ci  # noqa: E402
from evaluation.scoring import HEAVY_CLASS, LIGHT_CLASS  # noqa: E402
from evaluation.views import FIELD, LEVEL  # noqa: E402

GROUPS = {"all": lambda s: True,
          "light": lambda s: s["element_class"] == LIGHT_CLASS,
          "heavy": lambda s: s["element_class"] == HEAVY_CLASS,
          "< 50 A": lambda s: s["thickness_A"] < 50.0,
          "50-100 A": lambda s: 50.0 <= s["thickness_A"] < 100.0,
          ">= 100 A": lambda s: s["thickness_A"] >= 100.0}


def _columns(runs: dict[str, dict], target: str) -> list[tuple[str, str, dict[str, dict]]]:
    """(column name, method, samples by id) for each network and each baseline's first appearance."""
    columns, seen = [], set()
    for name, metrics in runs.items():
        by_id = {s["sample_id"]: s for s in metrics["samples"]}
        methods = next(iter(by_id.values()))["metrics"][target].keys() if by_id else []
        for method in methods:
            if method == NETWORK:
                columns.append((f"network ({name})", method, by_id))
            elif method not in seen:
                seen.add(method)
                columns.append((method, method, by_id))
    return columns


def table(runs: dict[str, dict], target: str = "potential", view: str = FIELD) -> str:
    """The markdown table (see the module docstring)."""
    columns = _columns(runs, target)
    common = set.intersection(*(set(by_id) for _, _, by_id in columns))
    lines = ["| samples (materials) | " + " | ".join(c for c, _, _ in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for group, keep in GROUPS.items():
        ids = sorted(i for i in common if keep(columns[0][2][i]))
        if not ids:
            continue
        materials = [columns[0][2][i]["material_id"] for i in ids]
        cells = []
        for _, method, by_id in columns:
            values = [by_id[i]["metrics"][target][method][view]["rel_l2"] for i in ids]
            ci = bootstrap_ci(values, n_resamples=500, seed=0, groups=materials)
            cells.append(f"{ci.value:.3f} [{ci.low:.3f}, {ci.high:.3f}]")
        lines.append(f"| {group}: {len(ids)} ({len(set(materials))}) | " + " | ".join(cells) + " |")
    for column, method, by_id in columns:
        if method == NETWORK:
            level = median(by_id[i]["metrics"][target][method][LEVEL]["level_error"] for i in common)
            lines.append(f"\n{column}: level error median {level:.3f} over {len(common)} samples")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evals", nargs="+", type=Path)
    parser.add_argument("--target", default="potential")
    parser.add_argument("--view", default=FIELD)
    args = parser.parse_args()
    runs = {path.name: json.loads((path / "metrics.json").read_text()) for path in args.evals}
    print(table(runs, args.target, args.view))


if __name__ == "__main__":
    main()
