"""Table of the dev-split recipe choice (benchmarks/study_selection.sh): per variant, the potential's
relative L2 (network, fitted iCoM, mean image; overall and on light materials), the network's error split
into its mean level and its contrast (rel_l2^2 = level^2 + contrast^2; evaluations before that split show -),
the density's (network, mean image), and the network against iCoM on the same shot-noised patterns at each evaluated dose,
read from each run's eval-dev/metrics.json.
    python benchmarks/study_selection_table.py OUT"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from physics_inputs_table import LIGHT, legacy, row


def dose_cells(metrics: dict) -> list[str]:
    """'network / iCoM' potential rel. L2 at each dose of the sweep."""
    cells = []
    for entry in metrics.get("dose_sweep") or []:
        head = entry["headline"]["potential"]
        cells.append(f"{legacy(head['network'])['rel_l2']:.3f} / {legacy(head['icom'])['rel_l2']:.3f}")
    return cells


def density_cells(metrics: dict) -> list[str]:
    head = metrics["headline"].get("density")
    return [f"{legacy(head[m])['rel_l2']:.3f}" for m in ("network", "mean")] if head else ["-", "-"]


def level_contrast_cells(metrics: dict) -> list[str]:
    """'level / contrast' of the network's potential error, overall and on light materials."""
    cells = []
    for agg in (metrics["aggregates"]["potential"],
                metrics.get("class_aggregates", {}).get("potential", {}).get(LIGHT)):
        phys = legacy((agg or {}).get("network", {}))
        level, contrast = phys.get("rel_l2_level"), phys.get("rel_l2_contrast")
        cells.append(f"{level['value']:.3f} / {contrast['value']:.3f}" if level and contrast else "-")
    return cells


def main(out: Path) -> None:
    runs = sorted(out.glob("*/eval-dev/metrics.json"))
    doses = [f"{e['dose_e_per_A2']:g} net / iCoM" for e in json.loads(runs[0].read_text()).get("dose_sweep") or []] \
        if runs else []
    header = ["variant", "net all", "iCoM all", "mean all", "net light", "iCoM light", "mean light",
              "net level / contrast", "light level / contrast", "density net", "density mean", *doses]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path in runs:
        metrics = json.loads(path.read_text())
        cells = ([f"{v:.3f}" for v in row(metrics)] + level_contrast_cells(metrics) + density_cells(metrics)
                 + dose_cells(metrics))
        print(f"| {path.parent.parent.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
