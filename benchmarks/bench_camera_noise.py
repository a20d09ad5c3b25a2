"""A real camera's noise against `namsa reconstruct` (issue 42, item 2): the same simulated scan recorded
as counts, by a scintillator camera (MTF sigma 1 px, gain 10 counts/e, read noise 2 counts) and with
read noise alone (gain 1, 2 counts), reconstructed by ``--model`` (default `pretrained:study-scan-gpu`;
any model folder, e.g. a fine-tune of it) before and after the counts are restored (stage.microscope.counts_restore). Prints, per specimen and camera, the potential's
relative L2 error under the field's rule (only the map's mean taken from the truth: evaluation.views),
its level (mean over the truth's mean), the gain/dark/read noise measured, and each figure as a ratio
to the counted scan's in the same run; the scintillator's scan also with its point spread given
(``--detector-psf-px 1``: deconvolved, stage.microscope.point_spread).

"before" is the code before the change: the checks' `camera_counts` replaced by a pass-through in this
process (the file is read as it is). A few minutes on a 2-core CPU.

    .venv/bin/python benchmarks/bench_camera_noise.py [--dose 10000] [--specimens GaAs-zincblende:011,Si-diamond:001]
        [--model pretrained:study-scan-gpu]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_MODEL = "pretrained:study-scan-gpu"
CAMERAS = {"counts": {},
           "scintillator": {"gain_counts_per_electron": 10.0, "read_noise_counts": 2.0, "mtf": "scintillator",
                            "scintillator_sigma_px": 1.0},
           "read noise": {"read_noise_counts": 2.0}}


def simulate(material: str, axis: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, tuple[float, float], float]:
    """(cbed (32, 32, 32, 32), true potential, scan step (y, x) Angstrom, detector pixel 1/Angstrom)
    at the study's physics, as tests/test_microscope_writers.py builds its scan."""
    import namsa

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32)
    sample = namsa.simulate_sample(namsa.load_structure(material), axis, cfg)
    m = sample.meta
    return sample.cbed.reshape(32, 32, 32, 32), sample.potential, (m.fov_A[2] / 32, m.fov_A[3] / 32), m.pattern_dk_inv_A


def reconstruct_file(frames: np.ndarray, step: tuple[float, float], dk: float, restore: bool,
                     model: str = DEFAULT_MODEL, psf_px: float | None = None) -> tuple[np.ndarray, dict]:
    """The potential map and reconstruction.json of ``frames`` written as .hspy and reconstructed by
    ``model`` (``pretrained:NAME`` or a model folder), given the camera's point spread ``psf_px``
    (``--detector-psf-px``) when not None."""
    import stage.microscope.checks as checks
    from stage.microscope import ScanCalibrations, write_scan
    from workflow.reconstruct import reconstruct

    original = checks.camera_counts
    if not restore:
        checks.camera_counts = lambda data, path, counted, report, block_bytes, psf: (data, counted, None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "scan.hspy"
            write_scan(path, frames, ScanCalibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=dk, step_A=step))
            reconstruct(str(path), model, Path(tmp) / "out", calibrations={"detector_psf_px": psf_px})
            info = json.loads((Path(tmp) / "out" / "reconstruction.json").read_text())
            return np.load(Path(tmp) / "out" / "potential.npy").astype(np.float64), info
    finally:
        checks.camera_counts = original


def scores(potential: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(relative L2 under the field's rule, level = mean(map) / mean(truth))."""
    from evaluation.metrics import relative_l2
    from evaluation.views import field_map

    return relative_l2(field_map(potential, truth), truth), float(potential.mean() / truth.mean())


def main() -> None:
    from namsa.camera import CameraSettings, record

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dose", type=float, default=1e4, help="e/Angstrom^2 (default 1e4)")
    ap.add_argument("--specimens", default="GaAs-zincblende:011,Si-diamond:001")
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"pretrained:NAME or a model folder (default {DEFAULT_MODEL})")
    args = ap.parse_args()
    for spec in args.specimens.split(","):
        material, axis = spec.split(":")
        cbed, truth, step, dk = simulate(material, tuple(int(c) for c in axis))
        print(f"{material} [{axis}], {args.dose:g} e/A^2, truth {truth.min():.0f}-{truth.max():.0f} V*A")
        reference = None
        for name, settings in CAMERAS.items():
            frames = record(cbed, step, CameraSettings(dose_e_per_A2=args.dose, seed=1, **settings))
            for label, restore, psf in passes(name, settings):
                potential, info = reconstruct_file(frames, step, dk, restore, args.model, psf)
                l2, level = scores(potential, truth)
                reference = reference or l2
                measured = info["checks"]["before"]["measured"]
                noise = measured.get("camera_noise", {})
                dose = (measured.get("dose_e_per_A2") or {}).get("value")
                print(f"  {name:12s} {label:12s}  rel. L2 {l2:.3f} ({l2 / reference:.2f}x counts)  "
                      f"level {level:.2f}  range {potential.min():.0f}-{potential.max():.0f}  dose "
                      f"{'-' if dose is None else f'{dose:.0f}'}  gain {noise.get('value')}  dark "
                      f"{noise.get('dark', float('nan')):.3g}  read {noise.get('read_noise', float('nan')):.3g}",
                      flush=True)


def passes(name: str, settings: dict) -> list[tuple[str, bool, float | None]]:
    """(label, counts restored, --detector-psf-px) of each reconstruction of a camera's scan: the counted
    scan once; the others before and after the restore; a scintillator's also deconvolved from its
    point spread, given as its camera calibration would give it."""
    if name == "counts":
        return [("after", True, None)]
    out = [("before", False, None), ("after", True, None)]
    if settings.get("mtf") == "scintillator":
        out.append(("after + psf", True, settings["scintillator_sigma_px"]))
    return out

if __name__ == "__main__":
    main()
