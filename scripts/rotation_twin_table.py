"""Which 180-degree twin of the scan rotation each candidate rule picks, on namsa simulations recorded
by namsa.camera (issue 42, item 4): prints a markdown table, rule x case -> ok / WRONG.

    .venv/bin/python scripts/rotation_twin_table.py [--dose 5000] [--focus 0,40,-40]

Cases: NiO [011] and Cu2O [011] (cuprite: namsa's AFLOW template A2B_cP6_224_b_a, not in the
library), 40, 60, 100, 150 Angstrom, at the study's physics (200 kV, 20 mrad, 32 x 32 scan of a 12
Angstrom cell, 32 px patterns), probe
C1 = --focus Angstrom (0: focused on the entrance surface), scan rotations 0, 20, 200 degrees and 20
with ky <-> kx swapped. Rules, each given the curl-free angle modulo 180 (and flip) that the fit found:
div.ADF (the old rule: CoM divergence negative where the dark field is bright), CoM.gradADF (the CoM
field along the dark field's gradient), iCoM.ADF (the integrated CoM against the dark field),
parallax (the bright-field parallax's sign, stage.microscope.twin), and fit_rotation as shipped.
"""
from __future__ import annotations

import argparse

import numpy as np

import namsa
from namsa.camera import CameraSettings, record
from stage.microscope import autocal, twin
from stage.microscope.disc import find_disc
from stage.microscope.rotation import Rotation

CASES = [(0.0, False), (20.0, False), (200.0, False), (20.0, True)]


#: cuprite Cu2O (Pn-3m, a = 4.267 Angstrom): namsa's checked AFLOW template, not in the library
CU2O = "A2B_cP6_224_b_a:Cu,O:1.0"


def simulate(material: str, thickness: float, focus: float) -> tuple[np.ndarray, tuple[float, float]]:
    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32, thickness_A=thickness,
                                 aberrations={"C1_A": focus})
    sample = namsa.simulate_sample(CU2O if material == "Cu2O" else material, (0, 1, 1), cfg)
    fov = sample.meta.fov_A
    return sample.cbed.reshape(32, 32, 32, 32), (fov[2] / 32, fov[3] / 32)


def scores(frames: np.ndarray) -> tuple[dict[str, float], Rotation, float]:
    """Each rule's score for the fit's angle modulo 180 (> 0 keeps it), the shipped fit, that angle."""
    disc = find_disc(autocal.subsample(frames).mean(axis=0))
    scalars = autocal.scan_scalars(frames, disc)
    cal = autocal.calibrate(frames, disc, scalars)
    sy, sx = scalars.total.shape
    com = scalars.com - cal.descan.at(*np.mgrid[:sy, :sx].astype(float))
    base = cal.rotation.angle_deg % 180.0
    turn = Rotation(base, cal.rotation.flip, 0.0, 0.0).matrix()
    field, dark = com @ turn.T, scalars.dark
    div = np.gradient(field[..., 0], axis=0) + np.gradient(field[..., 1], axis=1)
    gy, gx = np.gradient(dark)
    parallax = twin.bf_parallax(*twin.read_bf_images(frames, cal.descan.at, disc.radius_px))
    out = {"div.ADF": -float(np.sum(div * (dark - dark.mean()))),
           "CoM.gradADF": float(np.sum(field[..., 0] * gy + field[..., 1] * gx)),
           "iCoM.ADF": twin.com_score(com, dark, turn),
           "parallax": parallax.score(turn)[0] if parallax is not None else 0.0}
    return out, cal.rotation, base


def right(angle: float, flip: bool, want: float, want_flip: bool) -> bool:
    return flip == want_flip and abs((angle - want + 180.0) % 360.0 - 180.0) < 90.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dose", type=float, default=5000.0, help="e/Angstrom^2")
    ap.add_argument("--focus", default="0", help="probe C1 values (Angstrom), comma-separated")
    args = ap.parse_args()
    rules = ["div.ADF", "CoM.gradADF", "iCoM.ADF", "parallax", "fit_rotation"]
    print("| C1 (A) | crystal | t (A) | rotation | " + " | ".join(rules) + " | fitted (deg) |")
    print("|---" * (len(rules) + 5) + "|")
    wrong = dict.fromkeys(rules, 0)
    for focus in (float(f) for f in args.focus.split(",")):
        for material in ("NiO-rocksalt", "Cu2O"):
            for thickness in (40.0, 60.0, 100.0, 150.0):
                cbed, step = simulate(material, thickness, focus)
                for angle, flip in CASES:
                    frames = record(cbed, step, CameraSettings(dose_e_per_A2=args.dose, scan_rotation_deg=angle,
                                                               seed=1))
                    frames = np.ascontiguousarray(np.swapaxes(frames, 2, 3)) if flip else frames
                    rule_scores, fit, base = scores(frames)
                    marks = [right(base if s > 0 else base + 180, fit.flip, angle, flip) for s in rule_scores.values()]
                    marks.append(right(fit.angle_deg, fit.flip, angle, flip))
                    for name, ok in zip(rules, marks):
                        wrong[name] += not ok
                    print(f"| {focus:+.0f} | {material.split('-')[0]} [011] | {thickness:.0f} | {angle:.0f}"
                          f"{' flip' if flip else ''} | " + " | ".join("ok" if m else "**WRONG**" for m in marks)
                          + f" | {fit.angle_deg:.1f} +- {fit.error_deg:.1f} ({fit.twin}) |", flush=True)
    print("\nwrong: " + ", ".join(f"{k} {v}" for k, v in wrong.items()))


if __name__ == "__main__":
    main()
