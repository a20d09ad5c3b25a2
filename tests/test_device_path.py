"""The simulator's CUDA path, run on the CPU through the strict cupy stand-in (tests/strict_cupy.py).

The stand-in refuses host/device mixing as cupy does, so these tests find every place where the
device path would hand a numpy array to cupy (or a cupy array to numpy); they compare its numbers
with the CPU path's, which says the device code is the same physics. They claim nothing about GPU
speed or about cupy's own kernels: those are covered only on real hardware (``pytest -m gpu``).
"""
from __future__ import annotations

import numpy as np
import pytest

import strict_cupy
from namsa.config import SimulationConfig
from namsa.detector import pattern_rebinner
from namsa.library import get
from namsa.simulation import prepare_simulation
from namsa.supercell import orient_supercell

OPTICS = dict(energy_kv=200.0, semiangle_mrad=20.0)
POSITIONS = np.array([[0.5, 0.7], [2.0, 3.0], [3.3, 1.1], [4.0, 4.4], [1.2, 5.0]])


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def si110():
    """Si [110], about 11.5 x 10.9 x 8 Angstrom: a perfect tiling, so both paths apply."""
    return orient_supercell(get("Si-diamond"), (1, 1, 0), 8.0, 8.0)


def _patterns(structure, device: str, method: str, pattern_px: int = 24, **kw):
    """(full FFT-order intensities, rebinned patterns, kept sums, Simulation) on ``device``."""
    sim = prepare_simulation(structure, sampling_A=0.1, slice_thickness_A=2.0, device=device, method=method,
                             n_positions=len(POSITIONS), workers=1, **OPTICS, **kw)
    full = np.concatenate(sim.run(POSITIONS, lambda a: a.copy()), axis=0)
    reducer, _ = pattern_rebinner(sim.grid, 2 / 3, pattern_px, sim.backend)
    kept: list[np.ndarray] = []

    def reduce_and_count(intensity):
        kept.append(sim.backend.asnumpy(intensity.sum(axis=(-2, -1))))
        return reducer(intensity)

    rebinned = np.concatenate(sim.run(POSITIONS, reduce_and_count, device_reducer=True), axis=0)
    return full, rebinned, np.concatenate(kept), sim


@pytest.mark.parametrize("method", ["multislice", "periodic"])
def test_the_cuda_path_on_the_strict_stand_in_matches_the_cpu(monkeypatch, si110, method):
    cpu_full, cpu_rebinned, cpu_kept, cpu_sim = _patterns(si110, "cpu", method)
    strict_cupy.install(monkeypatch)
    dev_full, dev_rebinned, dev_kept, dev_sim = _patterns(si110, "cuda", method)
    assert dev_sim.method == cpu_sim.method == method and dev_sim.backend.name == "cuda:0"
    assert isinstance(dev_rebinned, np.ndarray) and dev_rebinned.dtype == np.float32
    assert rel_l2(dev_full, cpu_full) < 1e-5
    assert rel_l2(dev_rebinned, cpu_rebinned) < 1e-5
    np.testing.assert_allclose(dev_kept, cpu_kept, rtol=1e-5)
