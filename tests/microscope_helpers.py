"""Synthetic 4D-STEM scans (scan_y, scan_x, ky, kx) and an .hspy writer for the microscope tests.

`disc_scan` draws a convergent-beam bright-field disc (uniform, soft one-pixel edge); `spot_scan`
draws parallel-beam spot patterns (a lattice of small Gaussian spots), which are not CBED.
`write_hspy` stores a scan through rosettasciio with its calibrations in HyperSpy's metadata;
`rewrite_data` then replaces its 4-D dataset (contiguous, or declared larger than ever written);
`write_arina` writes a DECTRIS Arina master with its data files.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: the shipped study-scan model's physics: 200 kV, 20 mrad, detector pixel 0.6667 / (0.12 * 32)
STUDY_DK_INV_A = (2.0 / 3.0) / (0.12 * 32)
#: a camera test scan's probe step (Angstrom) and file calibrations, and benchmarks/bench_camera_noise.py's
#: scintillator (namsa.camera.CameraSettings fields: gain 10 counts/e, read noise 2 counts, MTF sigma 1 px)
CAMERA_STEP = (0.4, 0.4)
CAMERA_FOUND = {"energy_kv": 200.0, "semiangle_mrad": 20.0, "dk_inv_A": (STUDY_DK_INV_A,) * 2, "step_A": CAMERA_STEP}
SCINTILLATOR = {"gain_counts_per_electron": 10.0, "read_noise_counts": 2.0, "mtf": "scintillator",
                "scintillator_sigma_px": 1.0}


def disc_pattern(px: int, radius: float, centre: tuple[float, float] | None = None) -> np.ndarray:
    """(px, px) uniform disc of ``radius`` px (edge smoothed over one pixel) on a faint background,
    normalised to a total of 1; ``centre`` (ky, kx) defaults to (px // 2, px // 2)."""
    cy, cx = centre if centre is not None else (px // 2, px // 2)
    yy, xx = np.mgrid[:px, :px]
    r = np.hypot(yy - cy, xx - cx)
    p = np.clip(radius + 0.5 - r, 0.0, 1.0) + 1e-3
    return p / p.sum()


def disc_scan(shape: tuple[int, int] = (8, 8), px: int = 32, radius: float = 4.6) -> np.ndarray:
    """float32 (sy, sx, px, px) scan of identical centred discs."""
    return np.broadcast_to(disc_pattern(px, radius), (*shape, px, px)).astype(np.float32)


def spot_scan(shape: tuple[int, int] = (8, 8), px: int = 32, spacing: int = 6, sigma: float = 0.7) -> np.ndarray:
    """float32 (sy, sx, px, px) spot patterns: Gaussian spots on a square lattice, the central one
    twice as bright (parallel-beam diffraction of a crystal)."""
    yy, xx = np.mgrid[:px, :px]
    p = np.zeros((px, px))
    c = px // 2
    for gy in range(-2, 3):
        for gx in range(-2, 3):
            weight = 2.0 if gy == gx == 0 else 1.0
            p += weight * np.exp(-((yy - c - gy * spacing) ** 2 + (xx - c - gx * spacing) ** 2) / (2 * sigma ** 2))
    return np.broadcast_to(p / p.sum(), (*shape, px, px)).astype(np.float32)


def write_hspy(path: Path, data: np.ndarray, *, step_A: float = 0.375, dk_inv_A: float = STUDY_DK_INV_A,
               energy_kv: float = 200.0, semiangle_mrad: float | None = 20.0) -> Path:
    """Write ``data`` (sy, sx, ky, kx) as .hspy with scan step (Angstrom), detector pixel
    (1/Angstrom), beam energy (kV) and, unless None, convergence semi-angle (mrad)."""
    from rsciio.hspy import file_writer

    def axis(i: int, name: str, scale: float, unit: str) -> dict:
        return {"name": name, "size": data.shape[i], "offset": 0.0, "scale": scale, "units": unit,
                "navigate": i < 2, "index_in_array": i}

    tem = {"beam_energy": energy_kv}
    if semiangle_mrad is not None:
        tem["convergence_angle"] = semiangle_mrad
    signal = {"data": np.ascontiguousarray(data),
              "axes": [axis(0, "y", step_A, "Å"), axis(1, "x", step_A, "Å"),
                       axis(2, "ky", dk_inv_A, "1/Å"), axis(3, "kx", dk_inv_A, "1/Å")],
              "metadata": {"General": {"title": "scan"}, "Signal": {"signal_type": ""},
                           "Acquisition_instrument": {"TEM": tem}},
              "original_metadata": {}, "tmp_parameters": {}, "attributes": {"_lazy": False},
              "learning_results": {}, "models": {}, "package_info": {"name": "namsa-tests", "version": "0"}}
    file_writer(str(path), signal)
    return path


def defocused_si_scan(defocus_A: float = 200.0) -> tuple[np.ndarray, np.ndarray, Any]:
    """Si [001], 20 A, at C1 = ``defocus_A`` (the shipped study-scan model trained on +-40 A), on a
    32 x 32 scan of 32 px patterns: ((32, 32, 32, 32) noise-free scan, the true potential, its
    `stage.microscope.ScanCalibrations`). ~5 s."""
    import namsa
    from stage.microscope import ScanCalibrations

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32, thickness_A=20.0,
                                 aberrations={"C1_A": defocus_A, "C3_mm": 0.0})
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    m = sample.meta
    step = (m.fov_A[2] / 32, m.fov_A[3] / 32)
    cal = ScanCalibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=m.pattern_dk_inv_A, step_A=step)
    return sample.cbed.reshape(32, 32, 32, 32), sample.potential, cal


def simulated_scan() -> tuple[np.ndarray, dict]:
    """A real namsa simulation at the study's physics (200 kV, 20 mrad, 0.12 Angstrom, 32 px
    patterns) of GaAs [011] on an 8 x 8 scan: ((8, 8, 32, 32) float32 scan, its meta). ~1 s."""
    import namsa

    cfg = namsa.SimulationConfig(scan_shape=(8, 8), pattern_px=32, cell_lateral_A=6.0, thickness_A=20.0)
    sample = namsa.simulate_sample("GaAs-zincblende", (0, 1, 1), cfg)
    return sample.cbed.reshape(8, 8, 32, 32), sample.meta


def write_arina(folder: Path, frames: np.ndarray, per_file: int, link_to: str | None = None) -> Path:
    """An Arina master file as DECTRIS writes it: /entry/data/data_NNNNNN external links to data
    files beside it (each /entry/data/data, an (n, ky, kx) stack), /STEM Metadata's pixel size in nm."""
    import h5py

    master = folder / "scan_master.h5"
    with h5py.File(master, "w") as f:
        f.create_group("STEM Metadata").attrs["Pixel Size"] = np.array([0.05])
        group = f.create_group("entry/data")
        for i, start in enumerate(range(0, len(frames), per_file)):
            name = f"scan_data_{i + 1:06d}.h5"
            with h5py.File(folder / name, "w") as d:
                d.create_dataset("entry/data/data", data=frames[start: start + per_file])
            group[f"data_{i + 1:06d}"] = h5py.ExternalLink(link_to or name, "/entry/data/data")
    return master


def rewrite_data(path: Path, data: np.ndarray | None = None, *, declared: tuple[int, ...] | None = None) -> Path:
    """Replace the 4-D dataset of the .hspy ``path`` (its attributes kept): by ``data`` stored
    contiguously (no chunks, as h5py writes by default), or by a chunked, compressed dataset of
    shape ``declared`` of which no chunk is ever written (it reads back as zeros)."""
    import h5py

    with h5py.File(path, "a") as fh:
        name = "Experiments/scan/data"
        attrs = dict(fh[name].attrs)
        del fh[name]
        if declared is not None:
            fh.create_dataset(name, shape=declared, dtype="f4", chunks=(1, 1, *declared[2:]), compression="gzip")
        else:
            fh.create_dataset(name, data=data)
        fh[name].attrs.update(attrs)
    return path


def damage_first_chunk(path: Path) -> Path:
    """Invert 50 bytes inside the first compressed chunk of a .hspy's 4-D dataset: the file opens,
    and the damage shows only when that chunk is read (gzip fails)."""
    import h5py

    with h5py.File(path, "r") as fh:
        info = fh["Experiments/scan/data"].id.get_chunk_info(0)
    raw = bytearray(path.read_bytes())
    for i in range(info.byte_offset + 10, info.byte_offset + min(info.size, 60)):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    return path


def precession_scan(shape: tuple[int, int] = (8, 8), px: int = 64) -> np.ndarray:
    """uint8 (sy, sx, px, px) precession-electron-diffraction patterns as a NanoMegas camera records
    them (Debian's test1.blo): a saturated direct beam whose halo fades as 1 / r over many pixels,
    and a lattice of sharp Bragg spots; no bright-field disc of a convergence semi-angle."""
    yy, xx = np.mgrid[:px, :px]
    c = px // 2
    r = np.hypot(yy - c, xx - c)
    p = 300.0 / (1.0 + r / 2.5) + 20.0  # a focused beam's spot, its tail spread by the precession
    for gy in range(-2, 3):
        for gx in range(-2, 3):
            if gy or gx:
                p += 90.0 * np.exp(-((yy - c - 12 * gy) ** 2 + (xx - c - 12 * gx) ** 2) / (2 * 0.8 ** 2))
    return np.broadcast_to(np.clip(p, 0, 255).astype(np.uint8), (*shape, px, px)).copy()
