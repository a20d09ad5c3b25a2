"""How often the bright-field parallax's defocus check cries wolf inside the training focus, and how often
it catches a focus far outside it (stage.scan_statistics.parallax_defocus, judged by
models.scan_fit.card_checks.input_report, what `Reconstructor.predict` and `namsa reconstruct` warn with).

Scans simulated at the card's physics (200 kV, 20 mrad, 32 px, 32 x 32 scans for the flagship), each of a
library material drawn at random down one of its automatic zone axes, with frozen phonons off:

- ``inside``: thickness uniform in 10-150 A, the focus on the specimen's middle uniform in -35..115 A (the
  flagship's training range): every defocus finding is a false alarm;
- ``far``: thickness 10-80 A, the focus on the middle 500-4000 A either way (a ptychography setting):
  a defocus finding is a catch;
- ``readme``: README's example (tests/test_readme.py), Si [001] 40 A at C1 = 0 (the focus 20 A into the
  crystal), simulated at `SimulationConfig`'s defaults with 32 px patterns and a 32 x 32 scan.

Each scan is checked twice: with its probe step given (as `namsa evaluate` and `namsa reconstruct
--step` pass it) and without (as README's ``rec.predict(cbed)``: the check reads the training steps'
span). Prints one line a scan and the counts.

    .venv/bin/python benchmarks/parallax_window_study.py [--inside 40] [--far 30] [--seed 0]
        [--materials Si-diamond,MgO-rocksalt,...] [--cubic] [--axis 0,0,1]

``--cubic --axis 0,0,1`` is the case the parallax finds hardest: a lattice that repeats alike along the
scan's y and x aliases the focus alike along both (stage.scan_statistics, "Outside the search window").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models import flagship_name, pretrained_card  # noqa: E402
from models.scan_fit import card_checks  # noqa: E402
from namsa import SimulationConfig, simulate_sample  # noqa: E402
from namsa.library import info, list_ids  # noqa: E402
from namsa.optics import scan_step_A  # noqa: E402
from namsa.structure_io import load_structure  # noqa: E402
from namsa.zone_axes import auto_zone_axes  # noqa: E402

#: the flagship's training focus on the specimen's middle (its card: C1 -40..40 A at the entrance of
#: 10-150 A thick specimens)
INSIDE_FOCUS_A = (-35.0, 115.0)
FAR_FOCUS_A = (500.0, 4000.0)
#: the cubic crystal system's space groups are 195-230 (International Tables for Crystallography A)
FIRST_CUBIC_SPACE_GROUP = 195


def _config(card, thickness_A: float, focus_A: float):
    """The card's physics at ``thickness_A`` with the focus ``focus_A`` on the specimen's middle (namsa's
    C1 is set at the entrance surface: C1 = focus - thickness / 2)."""
    cfg = card.expects_input.simulation_config()
    variations = cfg.variations.model_copy(update={"frozen_phonon": False, "frozen_phonon_fraction": 0.0,
                                                   "thickness_range_A": None, "defocus_range_A": (0.0, 0.0),
                                                   "tilt_mrad": 0.0})
    aberrations = cfg.aberrations.model_copy(update={"C1_A": focus_A - thickness_A / 2})
    return cfg.model_copy(update={"variations": variations, "thickness_A": thickness_A,
                                  "aberrations": aberrations, "workers": 1})


def _findings(card, sample) -> tuple[str, str]:
    """(with the step given, without it): the defocus finding's first words, or '-' for none."""
    cbed = np.asarray(sample.cbed, np.float32)
    step = scan_step_A(sample.meta.fov_A, sample.meta.scan_shape)
    out = []
    for calibration in ({"scan_step_A": list(step)}, None):
        report = card_checks.input_report(cbed, card, calibration)
        said = [w["message"] for w in report["warnings"] if w["code"] == "defocus"]
        out.append(said[0][:60] if said else "-")
    return out[0], out[1]


def _draws(rng: np.random.Generator, n: int, far: bool, ids: list[str]) -> list[tuple[str, float, float]]:
    draws = []
    for _ in range(n):
        material = ids[int(rng.integers(len(ids)))]
        if far:
            thickness = float(rng.uniform(10.0, 80.0))
            focus = float(rng.uniform(*FAR_FOCUS_A)) * (1 if rng.random() < 0.5 else -1)
        else:
            thickness = float(rng.uniform(10.0, 150.0))
            focus = float(rng.uniform(*INSIDE_FOCUS_A))
        draws.append((material, thickness, focus))
    return draws


def run(card, name: str, draws, rng: np.random.Generator, axis: tuple[int, int, int] | None
        ) -> tuple[int, int, int]:
    """Scans ``draws`` (down ``axis``, else one of each material's automatic zone axes drawn at random) and
    prints a line each; (scans, findings with the step, findings without)."""
    given = unknown = done = 0
    for material, thickness, focus in draws:
        down = axis
        if down is None:
            axes = auto_zone_axes(load_structure(material))
            down = axes[int(rng.integers(len(axes)))]
        sample = simulate_sample(material, down, _config(card, thickness, focus))
        with_step, without = _findings(card, sample)
        given, unknown, done = given + (with_step != "-"), unknown + (without != "-"), done + 1
        print(f"{name} | {material} {list(down)} | {thickness:.0f} A | focus {focus:+.0f} A | step given: "
              f"{with_step} | not given: {without}", flush=True)
    return done, given, unknown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inside", type=int, default=40, help="scans with the focus inside the training range")
    parser.add_argument("--far", type=int, default=30, help="scans with the focus 500-4000 A from the middle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--materials", help="comma-separated library ids to draw from (default: the whole library)")
    parser.add_argument("--cubic", action="store_true",
                        help="draw from the library's cubic materials only (space groups 195-230)")
    parser.add_argument("--axis", help="U,V,W: every scan down this axis (default: drawn among each one's auto axes)")
    args = parser.parse_args()
    card = pretrained_card(flagship_name())
    rng = np.random.default_rng(args.seed)
    ids = args.materials.split(",") if args.materials else list_ids()
    if args.cubic:
        ids = [i for i in ids if info(i)["spacegroup_number"] >= FIRST_CUBIC_SPACE_GROUP]
    axis = tuple(int(i) for i in args.axis.split(",")) if args.axis else None
    inside, far = _draws(rng, args.inside, False, ids), _draws(rng, args.far, True, ids)
    readme = simulate_sample("Si-diamond", (0, 0, 1), SimulationConfig(scan_shape=(32, 32), pattern_px=32,
                                                                        target_px=32, workers=1))
    with_step, without = _findings(card, readme)
    print(f"readme | Si-diamond [0, 0, 1] | 40 A | focus +20 A | step given: {with_step} | not given: {without}")
    totals = {"readme": (1, int(with_step != "-"), int(without != "-")),
              "inside": run(card, "inside", inside, rng, axis), "far": run(card, "far", far, rng, axis)}
    for name, (done, given, unknown) in totals.items():
        what = "caught" if name == "far" else "false alarms"
        print(f"{name}: {done} scans; defocus findings ({what}): {given} with the step given, {unknown} without")


if __name__ == "__main__":
    main()
