"""Physics input channels: calibrated centre-of-mass and iCoM maps of a stack, on the targets' grid.

A network that is given what classical physics already knows (the CoM shift of each pattern is the
probe-weighted phase gradient; its integral, iCoM, is a probe-blurred projected potential for a
weak-phase object) only has to learn the correction (channelling, thickness, the probe blur), and
it sees the map's absolute amplitude directly, which the log-compressed patterns hide.

Channels (``PHYSICS_INPUTS``): ``com_y``, ``com_x`` (1/Angstrom, cycles) and ``icom``
(V*Angstrom), each computed from the same stack the network sees (after any dose augmentation), on
a (P, P) grid over the targets' field of view: the maps live on the scan grid (scan_y, scan_x) and
are resampled band-limited (`namsa.icom.resample_map`) so that they can travel as K extra (P, P)
planes after the S patterns: the network input becomes (S + K, P, P) (`models.fcdensenet`).
The math lives in `namsa.icom` (shared with the evaluation's iCoM baseline). Numpy only.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from namsa.errors import UserError
from namsa.icom import ScanCalibration, center_of_mass, icom_reconstruct, resample_map

#: the channels a model may ask for (``model.physics_inputs``), in their canonical order
PHYSICS_INPUTS: tuple[str, ...] = ("com_y", "com_x", "icom")

#: samples read to fit the channels' statistics (evenly spaced over the split): enough for a mean
#: and a standard deviation, and a bounded cost on a store of thousands of samples
MAX_STAT_SAMPLES = 256


def physics_maps(cbed: np.ndarray, cal: ScanCalibration, names: Sequence[str],
                 out_shape: Sequence[int]) -> np.ndarray:
    """float32 (K, *out_shape): the maps ``names`` of one stack (S, P, P) of intensities (any
    global scale: the CoM divides by each pattern's total), on the targets' grid of ``out_shape``."""
    unknown = [n for n in names if n not in PHYSICS_INPUTS]
    if unknown:
        raise UserError(f"unknown physics inputs {unknown}; choose from {list(PHYSICS_INPUTS)}")
    sy, sx = cal.scan_shape
    stack = np.asarray(cbed)
    maps: dict[str, np.ndarray] = {}
    if "com_y" in names or "com_x" in names:
        com = center_of_mass(stack, cal.k_sampling_invA or 1.0).reshape(sy, sx, 2)
        for axis, name in enumerate(("com_y", "com_x")):
            if name in names:
                maps[name] = resample_map(com[..., axis], out_shape, cal.shift_frac, cal.periodic)
    if "icom" in names:
        maps["icom"] = icom_reconstruct(stack, (sy, sx), k_sampling_invA=cal.k_sampling_invA, energy_kv=cal.energy_kv,
                                        scan_step_A=cal.scan_step_A, output_shape=out_shape,
                                        output_shift_frac=cal.shift_frac, periodic=cal.periodic)
    return np.stack([maps[n] for n in names]).astype(np.float32)


def typical_calibration(calibrations: Sequence[ScanCalibration]) -> ScanCalibration:
    """The median calibration of a training set: what `Reconstructor.predict` assumes for a raw
    stack given without one (the scan step varies with the material's supercell)."""
    first = calibrations[0]

    def median(attr: str) -> tuple[float, float] | None:
        values = [getattr(c, attr) for c in calibrations if getattr(c, attr) is not None]
        return tuple(float(v) for v in np.median(np.asarray(values), axis=0)) if values else None

    energies = [c.energy_kv for c in calibrations if c.energy_kv is not None]
    return ScanCalibration(scan_shape=first.scan_shape, k_sampling_invA=median("k_sampling_invA"),
                           energy_kv=float(np.median(energies)) if energies else None,
                           scan_step_A=median("scan_step_A"), shift_frac=median("shift_frac") or (0.0, 0.0),
                           periodic=all(c.periodic for c in calibrations))


def fit_physics_statistics(stores: Any, split: str, names: Sequence[str]) -> dict[str, Any]:
    """``{"physics": {name: [mean, std]}, "calibration": typical calibration dict}`` over (up to
    `MAX_STAT_SAMPLES` of) the ``split`` samples of an open `stage.StoreSet`, as the Normalizer
    records them."""
    indices = stores.indices(split)
    if not indices:
        raise UserError(f"no {split} samples in {stores.describe()} to fit the physics input statistics on")
    picked = [indices[int(i)] for i in np.unique(np.linspace(0, len(indices) - 1, MAX_STAT_SAMPLES).astype(int))]
    sums = np.zeros((len(names), 2))
    count = 0
    calibrations = []
    for i in picked:
        reader, j = stores.locate(i)
        arrays, meta = reader.read_arrays(j, names=("cbed",), dtype=np.float32)
        cal = meta.calibration
        calibrations.append(cal)
        maps = physics_maps(arrays["cbed"], cal, names, arrays["cbed"].shape[1:]).astype(np.float64)
        sums += np.stack([maps.sum(axis=(1, 2)), (maps ** 2).sum(axis=(1, 2))], axis=1)
        count += maps[0].size
    mean = sums[:, 0] / count
    std = np.sqrt(np.maximum(sums[:, 1] / count - mean ** 2, 0.0))
    stats = {n: [float(m), float(s if s > 1e-12 else 1.0)] for n, m, s in zip(names, mean, std)}
    return {"physics": stats, "calibration": typical_calibration(calibrations).to_dict()}


def batch_physics_planes(cbed: np.ndarray, calibration: Any, names: Sequence[str], normalizer: Any) -> np.ndarray:
    """float32 (B, K, P, P): the standardised maps ``names`` of a batch of raw stacks (B, S, P, P),
    as the loader (`stage.physics_dataset`) computes them. ``calibration``: one
    `ScanCalibration` (or its dict) for every stack, a sequence of one per stack, or None for the
    training set's typical calibration that ``normalizer.calibration`` records."""
    stacks = np.asarray(cbed)
    cals = list(calibration) if isinstance(calibration, list) else [calibration] * len(stacks)
    if len(cals) != len(stacks):
        raise UserError(f"{len(cals)} calibrations for {len(stacks)} stacks; pass one, or one per stack")
    if any(c is None for c in cals) and normalizer.calibration is None:
        raise UserError("this model takes physics inputs but records no scan calibration; pass calibration=")
    cals = [c if isinstance(c, ScanCalibration) else ScanCalibration.from_dict(c or normalizer.calibration)
            for c in cals]
    maps = np.stack([physics_maps(x, c, names, x.shape[1:]) for x, c in zip(stacks, cals)])
    return normalizer.physics(maps, names)


__all__ = ["batch_physics_planes", "PHYSICS_INPUTS", "physics_maps", "typical_calibration", "fit_physics_statistics", "MAX_STAT_SAMPLES"]
