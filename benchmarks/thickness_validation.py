"""Figures of the thickness estimate (models/scan_fit/thickness.py) with the shipped reference:

1. NiO [011] and cuprite Cu2O [001], [011] (neither in the reference set) at 60, 150 and 300 A, with and
   without frozen phonons, full 32 x 32 scans with the card's physics: estimate, range, flagged or not;
2. leave-one-material-out over the reference set itself (each material against the others);
3. dev-like samples (study physics, structure types of the shipped study's dev split, thickness, tilt,
   defocus drawn as in training): the estimate's error, and whether it tracks the shipped network's
   level error |mean(pred) - mean(true)| / |mean(true)| (Spearman), as drawn (a tenth with frozen phonons)
   and with frozen phonons forced (as every real specimen has);
4. ``--known``: the specimen named (`KnownSpecimen`, ``namsa reconstruct --specimen --zone-axis``): scans of
   `KNOWN` (NiO, cuprite and four structure types of the dev split, none in the reference set) at 60, 150
   and 300 A with frozen phonons, tilt and defocus drawn as in training, each matched against its own
   material's series (the estimate's error, flagged or not), and against every other material of the list
   named by mistake (the best residual: how far a wrong name's match lies from a right one's).

    .venv/bin/python benchmarks/thickness_validation.py [--dev N] [--skip-validation] [--known]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.card import CARD_FILE, read_card_file  # noqa: E402
from models.scan_fit.thickness import (MAX_OWN_RESIDUAL, REFERENCE_FILE, WARNING_CODE, ThicknessReference,  # noqa: E402
                                       check_thickness, estimate_thickness, load_reference, match_profile,
                                       position_averaged, tail_profile)
from stage.microscope.check_report import new_report  # noqa: E402
from models.scan_fit.thickness_reference import KnownSpecimen, first_axis  # noqa: E402
from namsa import simulate_sample  # noqa: E402

MODEL = ROOT / "models" / "pretrained" / "study-scan-gpu"
CUPRITE = "A2B_cP6_224_b_a:Cu,O:1.0"
DEV = ("A2B_tP6_129_ac_c:Hg,As:1.1191", "AB_cF16_227_a_b:Dy,Al:0.9642", "AB3C4_cP8_215_a_c_e:Li,Ta,S:1.0669",
       "A6B_cP7_221_f_a:Pt,Sb:1.6621", "AB_oP8_57_d_d:Tl,Cl:1.1711", "MgB2-AlB2", "LiCoO2-layered",
       "A_tP12_96_ab:Ge:1.0957", "AB_hP2_187_d_a:Ru,C:0.9459", "A_oC8_64_f~3:C:0.5080")


#: the specimens of the known-specimen validation: none is in the reference set
KNOWN = (("NiO-rocksalt", (0, 1, 1)), (CUPRITE, (0, 0, 1)), (CUPRITE, (0, 1, 1)))


def _cfg(card, thickness=None, phonons=None):
    cfg = card.expects_input.simulation_config()
    update = {} if phonons is None else {"frozen_phonon": True, "frozen_phonon_fraction": 1.0 if phonons else 0.0}
    if thickness is not None:
        update["thickness_range_A"] = None
    variations = cfg.variations.model_copy(update=update)
    return cfg.model_copy(update={"variations": variations, **({"thickness_A": thickness} if thickness else {})})


def _line(name, true, found, extra=""):
    if isinstance(found, str):
        return f"| {name} | {true:.0f} | - | {found} | {extra}"
    return (f"| {name} | {true:.0f} | {found.value_A:.0f} | {found.low_A:.0f}-{found.high_A:.0f}"
            f"{' (at least)' if found.at_least else ''} | {found.nearest} | {extra}")


def validation(card, reference: ThicknessReference) -> None:
    print("| scan | true A | estimate A | range A | nearest reference | flagged |\n|---|---|---|---|---|---|")
    for material, axis in (("NiO-rocksalt", (0, 1, 1)), (CUPRITE, (0, 0, 1)), (CUPRITE, (0, 1, 1))):
        for phonons in (True, False):
            for thickness in (60.0, 150.0, 300.0):
                s = simulate_sample(material, axis, _cfg(card, thickness, phonons))
                report = new_report()
                found = check_thickness(report, s.cbed, card, s.meta.angular_sampling_mrad)
                found = found or report["measured"]["thickness_A"]["note"]
                flagged = WARNING_CODE in [w["code"] for w in report["warnings"]]
                name = f"{s.meta.formula} {list(axis)} {'TDS' if phonons else 'no TDS'}"
                print(_line(name, s.meta.thickness_A, found, "yes" if flagged else "no"), flush=True)


def leave_one_out(reference: ThicknessReference) -> None:
    errors, covered = [], []
    for m, name in enumerate(reference.names):
        others = ThicknessReference([n for i, n in enumerate(reference.names) if i != m], reference.depths_A,
                                    np.delete(reference.profiles, m, axis=0), reference.physics)
        for d in range(2, len(reference.depths_A), 3):
            found = match_profile(reference.profiles[m, d], others)
            true = reference.depths_A[d]
            errors.append(abs(found.value_A - true) / true)
            covered.append(found.low_A <= true <= found.high_A or (found.at_least and true >= found.low_A))
    print(f"leave-one-material-out over {len(reference.names)} materials x {len(errors) // len(reference.names)} "
          f"depths: median |error| {np.median(errors):.2f}, 90th percentile {np.percentile(errors, 90):.2f}; "
          f"truth inside the stated range in {np.mean(covered):.0%}")


def dev_like(card, reference: ThicknessReference, count: int) -> None:
    from models.reconstructor import load_reconstructor

    rec = load_reconstructor(f"pretrained:{MODEL.name}", device="cpu")
    for phonons in (None, True):
        rows = []
        for material in DEV[:count]:
            s = simulate_sample(material, first_axis(material), _cfg(card, phonons=phonons))
            pred = rec.predict(s.cbed, calibration=s.meta.calibration)[0]
            level = abs(float(pred.mean()) - float(s.potential.mean())) / abs(float(s.potential.mean()))
            found = estimate_thickness(s.cbed, reference, s.meta.angular_sampling_mrad)
            rows.append((s.meta.thickness_A, None if isinstance(found, str) else found.value_A, level,
                         s.meta.frozen_phonon, s.meta.formula))
            print(f"  {s.meta.formula:10s} TDS={s.meta.frozen_phonon!s:5s} true {s.meta.thickness_A:5.0f} "
                  f"est {rows[-1][1]} level error {level:.3f}", flush=True)
        _dev_summary("as drawn" if phonons is None else "frozen phonons forced", rows)


def _dev_summary(label: str, rows: list) -> None:
    from scipy.stats import spearmanr

    true, est, level = (np.array([r[i] for r in rows if r[1] is not None], float) for i in range(3))
    print(f"dev-like, {label}: {len(true)} samples; estimate |error| median {np.median(abs(est - true) / true):.2f}; "
          f"Spearman(estimate, true) {spearmanr(est, true)[0]:.2f}; Spearman(level error, true thickness) "
          f"{spearmanr(level, true)[0]:.2f}; Spearman(level error, estimate) {spearmanr(level, est)[0]:.2f}; "
          f"level error median {np.median(level):.3f}")


def known_specimen(card) -> None:
    """Section 4 of the module docstring: own-series estimates and wrong-name residuals."""
    cfg = card.expects_input.simulation_config()
    specimens = [KnownSpecimen(m, a) for m, a in KNOWN] + [KnownSpecimen(m, first_axis(m)) for m in DEV[:3]]
    references = [sp.reference(cfg) for sp in specimens]
    errors, own, wrong = [], [], []
    print("| specimen | true A | own-series estimate A | range A | flagged | best wrong name (residual) |\n|---|---|---|---|---|---|")
    for sp, ref in zip(specimens, references):
        for thickness in (60.0, 150.0, 300.0):
            s = simulate_sample(sp.material, sp.zone_axis, _cfg(card, thickness, True))
            report = new_report()
            found = check_thickness(report, s.cbed, card, s.meta.angular_sampling_mrad, specimen=sp, reference=ref)
            flagged = WARNING_CODE in [w["code"] for w in report["warnings"]]
            profile = report["measured"]["thickness_A"]
            others = [(match_profile(tail_profile(position_averaged(s.cbed), s.meta.angular_sampling_mrad), r), r)
                      for r in references if r is not ref]
            worst = min(others, key=lambda o: o[0].residual)
            errors.append(abs(found.value_A - s.meta.thickness_A) / s.meta.thickness_A)
            own.append(found.residual)
            wrong += [o[0].residual for o in others]
            print(f"| {sp.name} | {s.meta.thickness_A:.0f} | {found.value_A:.0f} | {found.low_A:.0f}-{found.high_A:.0f} | "
                  f"{'yes' if flagged else 'no'} | {worst[1].names[0]} ({worst[0].residual:.2g}; own {found.residual:.2g}) |",
                  flush=True)
            assert profile["method"].startswith("PACBED matched to")
    print(f"known specimen: median |error| {np.median(errors):.3f}, largest {max(errors):.3f}; own residual at most "
          f"{max(own):.3g}; a wrong name's at least {min(wrong):.3g} (median {np.median(wrong):.3g}), above "
          f"MAX_OWN_RESIDUAL ({MAX_OWN_RESIDUAL:g}: caught) in {np.mean(np.array(wrong) > MAX_OWN_RESIDUAL):.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", type=int, default=len(DEV), help="dev-like materials (0 skips)")
    parser.add_argument("--skip-validation", action="store_true")
    parser.add_argument("--known", action="store_true", help="only section 4 (the specimen named)")
    args = parser.parse_args()
    card = read_card_file(MODEL / CARD_FILE)
    reference = load_reference(MODEL / REFERENCE_FILE)
    start = time.perf_counter()
    if args.known:
        known_specimen(card)
        print(f"({time.perf_counter() - start:.0f} s)")
        return
    leave_one_out(reference)
    if not args.skip_validation:
        validation(card, reference)
    if args.dev:
        dev_like(card, reference, args.dev)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
