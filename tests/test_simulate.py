"""simulate_sample / plan_samples / SimulationConfig: contracts, determinism, variations, bad input."""
from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from namsa import SampleSpec, SimulationConfig, UserError, plan_samples, simulate_sample
from namsa.detector import overlap_matrix, pattern_rebinner
from namsa.potential import Grid
from namsa.sample import REQUIRED_META_KEYS
from namsa.simulate import resolve_fov

#: a small, fast physics config: 6x6 scan, 12 px patterns and targets, ~70 px grid, 8 A thick
SMALL = dict(scan_shape=(6, 6), pattern_px=12, target_px=12, cell_lateral_A=8.0, thickness_A=8.0,
             sampling_A=0.12, slice_thickness_A=2.0)


@pytest.fixture(scope="module")
def si_sample():
    return simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**SMALL))


def test_sample_has_the_contract_shapes_and_meta(si_sample):
    s = si_sample.validate()
    assert s.cbed.shape == (36, 12, 12) and s.cbed.dtype == np.float32
    assert s.potential.shape == s.density.shape == (12, 12)
    assert s.potential.dtype == s.density.dtype == np.float32
    assert not s.meta.missing(REQUIRED_META_KEYS) and set(REQUIRED_META_KEYS) <= set(s.meta.to_json())
    m = s.meta
    assert m.material_id == "Si-diamond" and m.formula == "Si" and m.elements == ("Si",)
    assert m.zone_axis == (1, 1, 0) and m.scan_shape == (6, 6)
    assert len(m.scan_positions_A) == 36
    assert m.config_hash == SimulationConfig(**SMALL).physics_hash()
    assert m.sample_id == SampleSpec("Si-diamond", (1, 1, 0), 0).sample_id(SimulationConfig(**SMALL))
    # the probe never gains intensity; most of it stays inside the band limit
    sums = s.cbed.sum(axis=(1, 2))
    assert (sums <= 1.0 + 1e-5).all() and sums.min() > 0.9
    assert m.intensity_kept_min > 0.9
    assert m.method == "multislice"   # 36 probes: cheaper than propagating ~500 aperture beams


def test_patterns_centred_on_k0(si_sample):
    """The scan-averaged pattern of a centrosymmetric crystal is centred on pixel P // 2."""
    mean = si_sample.cbed.mean(axis=0)
    p = mean.shape[0]
    cy = (mean.sum(1) * np.arange(p)).sum() / mean.sum()
    cx = (mean.sum(0) * np.arange(p)).sum() / mean.sum()
    assert cy == pytest.approx(p // 2, abs=0.05) and cx == pytest.approx(p // 2, abs=0.05)


def test_targets_over_the_fov(si_sample):
    """Mean projected potential = mean inner potential x thickness; density holds sum(Z) per area."""
    m = si_sample.meta
    lx, ly, lz = m.cell_A
    atoms_per_A3 = 8 / 5.431 ** 3
    assert si_sample.density.mean() == pytest.approx(14 * atoms_per_A3 * lz, rel=1e-3)
    # Kirkland f_e(0) of Si gives a 13.9 V mean inner potential
    assert si_sample.potential.mean() / lz == pytest.approx(13.9, rel=0.01)


def test_same_inputs_same_sample_and_variants_differ():
    cfg = SimulationConfig(**SMALL, variations={"frozen_phonon": True, "defocus_range_A": (-50.0, 50.0)})
    a = simulate_sample("Si-diamond", (1, 1, 0), cfg, variant=0)
    b = simulate_sample("Si-diamond", (1, 1, 0), cfg, variant=0)
    c = simulate_sample("Si-diamond", (1, 1, 0), cfg, variant=1)
    np.testing.assert_array_equal(a.cbed, b.cbed)
    assert a.meta.seed == b.meta.seed != c.meta.seed
    assert a.meta.aberrations["C1_A"] != c.meta.aberrations["C1_A"]
    assert a.meta.method == "multislice"   # displaced atoms: no exact tiling
    assert -50 <= a.meta.aberrations["C1_A"] <= 50 and a.meta.frozen_phonon
    assert np.abs(a.cbed - c.cbed).max() > 1e-3
    assert a.id != c.id


REPRODUCE = """
import hashlib, sys
from namsa import SimulationConfig, simulate_sample
cfg = SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32, cell_lateral_A=12.0, thickness_A=40.0,
                       variations={"frozen_phonon": sys.argv[1] == "phonon"})
print(hashlib.sha256(simulate_sample("Si-diamond", (1, 1, 0), cfg).cbed.tobytes()).hexdigest())
"""


@pytest.mark.parametrize("kind", ["perfect", "phonon"])  # the S-matrix and the multislice paths
def test_a_sample_is_bit_identical_in_every_process(kind, tmp_path):
    """FFTW plans are measured (FFTW_PATIENT) once, by the first process, and every later process
    plans from the wisdom it saved (namsa.fftplans): plans measured independently in each process
    picked different algorithms and changed the last bits of the patterns."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NAMSA_CACHE_DIR=str(tmp_path))   # empty: the first process measures
    hashes = {subprocess.run([sys.executable, "-c", REPRODUCE, kind], capture_output=True, text=True, env=env,
                             check=True, timeout=300).stdout.strip() for _ in range(2)}
    assert len(hashes) == 1, hashes
    assert list(tmp_path.glob("fftw-wisdom-*.json"))


def test_tilt_variation_is_recorded_and_bounded():
    cfg = SimulationConfig(**SMALL, variations={"tilt_mrad": 5.0})
    s = simulate_sample("Si-diamond", (1, 1, 0), cfg, variant=3)
    assert 0 < np.hypot(*s.meta.tilt_mrad) <= 5.0


def test_rebinning_conserves_intensity_and_puts_k0_at_p_half():
    edges = np.arange(11) - 5.5
    w = overlap_matrix(edges, np.linspace(-3, 3, 4))
    np.testing.assert_allclose(w.sum(axis=0)[3:8], 1.0)   # source bins fully inside the range
    grid = Grid(gpts=(48, 50), sampling=(0.1, 0.1))
    reduce, dk = pattern_rebinner(grid, 2 / 3, 8)
    delta = np.zeros((1, 48, 50), np.float32)
    delta[0, 0, 0] = 1.0                                  # k = 0 in FFT order
    out = reduce(delta)
    assert out[0, 4, 4] == pytest.approx(1.0) and out.sum() == pytest.approx(1.0)
    assert dk == pytest.approx(2 * (2 / 3) * 5.0 / 8)


def test_config_validation_and_hash():
    assert SimulationConfig() == SimulationConfig.model_validate({})
    # target and pattern sizes are independent here; whether a model can map one to the other is the
    # pipeline config's check against the model's input layout (tests/test_scan_layout.py)
    assert SimulationConfig(pattern_px=32, target_px=16).target_px == 16
    with pytest.raises(ValidationError, match="outside the cell"):
        SimulationConfig(scan_fov_fraction=1.5)
    with pytest.raises(ValidationError, match="extra"):
        SimulationConfig(energy_kev=200)
    base = SimulationConfig().physics_hash()
    assert SimulationConfig(device="cuda:1", memory_budget_gb=64, materials=["Si-diamond"],
                            generator={"count": 5}).physics_hash() == base
    for change in ({"energy_kv": 300}, {"aberrations": {"C3_mm": 1.0}}, {"seed": 1},
                   {"variations": {"frozen_phonon": True}}, {"slice_thickness_A": 1.0},
                   {"variations": {"thickness_range_A": [20, 40]}}, {"variations": {"dose_e_per_A2": 1e4}}):
        assert SimulationConfig(**change).physics_hash() != base, change


def test_bad_inputs_are_one_line_user_errors():
    with pytest.raises(ValidationError, match="scan_fov_A.*inside"):
        SimulationConfig(**{**SMALL, "scan_fov_A": (0, 0, 7.9, 8.5)})
    cfg = SimulationConfig(**{**SMALL, "scan_fov_A": (1.0, 1.0, 6.0, 7.0)})
    assert resolve_fov(cfg, (8.0, 7.5, 4.0)) == (1.0, 1.0, 6.0, 7.0)
    with pytest.raises(UserError, match="scan_fov_A.*outside") as err:
        resolve_fov(cfg, (7.5, 6.5, 4.0))   # a cell smaller than the fov (Lx, Ly, Lz)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="too coarse"):
        simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**{**SMALL, "sampling_A": 0.6}))
    with pytest.raises(UserError, match="cell too large for memory"):
        simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**{**SMALL, "memory_budget_gb": 1e-4}))
    with pytest.raises(UserError):
        simulate_sample("Si-diamond", (0, 0, 0), SimulationConfig(**SMALL))
    with pytest.raises(UserError):
        simulate_sample("no-such-material", (0, 0, 1), SimulationConfig(**SMALL))


def test_plan_records_failures_and_collapses_identical_variants(tmp_path):
    (tmp_path / "broken.cif").write_text("data_broken\n_cell_length_a 3.0\n")
    cfg = SimulationConfig(materials=["Si-diamond", "no-such-material"], cif_dir=str(tmp_path),
                           zone_axes=[(0, 0, 1), (1, 1, 0)], variants=3)
    plan = plan_samples(cfg)
    assert [s.zone_axis for s in plan.specs] == [(0, 0, 1), (1, 1, 0)]   # no variation: one variant each
    failed = dict(plan.failures)
    assert len(failed) == 2 and "no-such-material" in failed and any(k.startswith("broken") for k in failed)
    assert all("\n" not in why for why in failed.values())
    varied = plan_samples(SimulationConfig(**{**cfg.model_dump(), "variations": {"frozen_phonon": True}}))
    assert len(varied.specs) == 6 and {s.variant for s in varied.specs} == {0, 1, 2}
    assert len({s.sample_id(cfg) for s in varied.specs}) == 6


def test_auto_zone_axes_plan_over_the_library():
    plan = plan_samples(SimulationConfig(max_zone_axes=2))
    from namsa.library import list_ids

    assert {s.material_id for s in plan.specs} | {m for m, _ in plan.failures} == set(list_ids())
    per_material = {}
    for spec in plan.specs:
        per_material.setdefault(spec.material_id, []).append(spec.zone_axis)
    assert all(1 <= len(v) <= 2 for v in per_material.values())


def test_public_names_and_lazy_submodules():
    import namsa
    from namsa import load_structure

    for name in ("__version__", "UserError", "Sample", "sample_id", "SimulationConfig", "load_structure",
                 "simulate_cbed", "simulate_sample", "plan_samples", "Plan", "SampleSpec"):
        assert hasattr(namsa, name), name
    assert load_structure is namsa.structure_io.load_structure
    assert "Si-diamond" in namsa.library.list_ids()


def test_phonon_configs_average_the_patterns_of_that_many_thermal_configurations():
    from namsa import simulate_cbed
    from namsa.library import get
    from namsa.variations import phonon_configurations
    from namsa.supercell import orient_supercell

    varied = {"frozen_phonon": True, "defocus_range_A": (-30.0, 30.0)}
    cfg = SimulationConfig(**SMALL, variations=varied, phonon_configs=3)
    mean3 = simulate_sample("Si-diamond", (1, 1, 0), cfg)
    one = simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**SMALL, variations=varied))
    assert mean3.meta.phonon_configs == 3 and one.meta.phonon_configs == 1
    # the other draws of the sample do not depend on how many configurations are averaged
    assert mean3.meta.seed == one.meta.seed and mean3.meta.aberrations == one.meta.aberrations
    supercell = orient_supercell(get("Si-diamond"), (1, 1, 0), cfg.cell_lateral_A, cfg.thickness_A)
    seed = mean3.meta.seed
    configs = phonon_configurations(supercell, cfg, np.random.default_rng(seed), seed)
    assert len(configs) == 3 and len({c.positions_A.tobytes() for c in configs}) == 3
    positions = np.array(mean3.meta.scan_positions_A)
    patterns = []
    for config in configs:
        full, info = simulate_cbed(config, positions, energy_kv=cfg.energy_kv, semiangle_mrad=cfg.semiangle_mrad,
                                   sampling_A=cfg.sampling_A, slice_thickness_A=cfg.slice_thickness_A,
                                   aberrations=mean3.meta.aberrations, return_info=True)
        reduce, _ = pattern_rebinner(Grid(gpts=tuple(info["gpts"]), sampling=tuple(info["sampling_A"])),
                                     cfg.band_limit, cfg.pattern_px)
        patterns.append(reduce(np.fft.ifftshift(full, axes=(-2, -1))))
    np.testing.assert_allclose(patterns[0], one.cbed, rtol=1e-5, atol=1e-8)   # configuration 0 = the snapshot
    np.testing.assert_allclose(np.mean(patterns, axis=0), mean3.cbed, rtol=1e-5, atol=1e-8)
    assert np.abs(mean3.cbed - one.cbed).max() > 1e-4
    assert mean3.potential.shape == one.potential.shape and not np.array_equal(mean3.potential, one.potential)


def test_phonon_configs_need_frozen_phonons_and_one_keeps_the_sample_ids():
    with pytest.raises(ValidationError, match="phonon_configs=4.*frozen_phonon"):
        SimulationConfig(phonon_configs=4)
    with pytest.raises(ValidationError):
        SimulationConfig(phonon_configs=0, variations={"frozen_phonon": True})
    fp = {"frozen_phonon": True}
    # the physics hashes pinned: phonon_configs=1 keeps the ids of a config without it. Values of
    # PHYSICS_SCHEMA 3 (one stream per random draw, 2026-11-26); schema 2 (the Gaussian targets) had
    # 5e2e6a0f3def... and 0750d777b89e..., schema 1 e315230e6d1f... and 4795cca55e69...: each bump
    # changed them on purpose.
    assert SimulationConfig().physics_hash() == "4ea27526f8f8206854b1024ec94cbe527119c7a11522c8037edd80faf8e32329"
    assert SimulationConfig(variations=fp, phonon_configs=1).physics_hash() == \
        SimulationConfig(variations=fp).physics_hash() == \
        "ee509a3020e0128d0c639317bffb02d8a708f1e1395d6b46e0079a42807487d8"
    assert SimulationConfig(variations=fp, phonon_configs=2).physics_hash() != \
        SimulationConfig(variations=fp).physics_hash()


def test_simulate_cbed_orients_a_structure_along_a_zone_axis():
    import namsa
    from namsa.supercell import orient_supercell

    structure = namsa.load_structure("Si-diamond")
    physics = dict(energy_kv=200.0, semiangle_mrad=20.0, sampling_A=0.15)
    positions = [[1.0, 1.5], [2.0, 2.5]]
    ours, info = namsa.simulate_cbed(structure, positions, zone_axis=(1, 1, 0), lateral_A=8.0, thickness_A=6.0,
                                     return_info=True, **physics)
    supercell = orient_supercell(structure, (1, 1, 0), 8.0, 6.0)
    np.testing.assert_array_equal(ours, namsa.simulate_cbed(supercell, positions, **physics))
    assert info["cell_A"] == list(supercell.cell_A)
    with pytest.raises(UserError, match=r"cannot simulate a Structure as it is: pass zone_axis=\(u, v, w\)") as err:
        namsa.simulate_cbed(structure, positions, **physics)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="pass zone_axis"):
        namsa.simulate_cbed(supercell, positions, thickness_A=6.0, **physics)
