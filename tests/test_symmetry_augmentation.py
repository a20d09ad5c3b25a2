"""The square group's rotations/mirrors as augmentation (stage/symmetry.py): each of the 8
operations applied to a real simulation equals the simulation of the turned specimen.

The specimen is four atoms of different elements at arbitrary places in a square periodic cell
(no symmetry of its own); the scan is endpoint-exclusive over the whole cell, so its positions
are symmetric about their centre c = (n - 1) / 2 steps, and the turned specimen is the original
turned about c (atoms wrapped back into the periodic cell): then every probe position of the
turned scan is a probe position of the original one, exactly.
"""
from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import stage
from namsa.detector import pattern_rebinner
from namsa.errors import UserError
from namsa.optics import scan_positions
from namsa.potential import build_potential, make_grid
from namsa.simulate import simulate_cbed
from namsa.targets import projected_density_map, projected_potential_map
from stage.config import SymmetryAugmentationConfig
from stage.symmetry import OPS, SymmetryAugmentation, SymmetryOp, allowed_ops, apply_op
from stage_helpers import CONFIG_HASH, make_sample

SIDE_A = 8.0
SCAN = 8
GPTS = 64
FWHM_A = 1.0
#: [x, y, z] Angstrom and Z: no rotation or mirror of the square group maps this onto itself
ATOMS = (np.array([[2.1, 3.3, 0.5], [5.2, 1.7, 1.5], [6.0, 6.4, 2.5], [3.9, 5.1, 3.5]]), np.array([79, 8, 14, 29]))
ON = SymmetryAugmentationConfig(enabled=True)


def _turned(positions_A: np.ndarray, op: SymmetryOp) -> np.ndarray:
    """Atom positions [x, y, z] of the specimen as ``op`` turns it about the scan centre: the
    array op puts old[T(F(d))] at displacement d, so an atom at displacement a moves to F(T(a))."""
    centre = (SCAN - 1) / 2 * SIDE_A / SCAN
    yx = positions_A[:, [1, 0]] - centre
    if op.transpose:
        yx = yx[:, ::-1]
    yx = yx * np.array([-1.0 if op.flip_y else 1.0, -1.0 if op.flip_x else 1.0])
    yx = (yx + centre) % SIDE_A
    return np.column_stack([yx[:, 1], yx[:, 0], positions_A[:, 2]])


def _simulate(positions_A: np.ndarray, pattern_px: int) -> SimpleNamespace:
    """Real multislice of the specimen: (S, P, P) patterns rebinned as simulate_sample does, and
    the T x T targets (T = scan size) over the whole cell."""
    from ase import Atoms

    cell = (SIDE_A, SIDE_A, 4.0)
    atoms = Atoms(numbers=ATOMS[1], positions=positions_A, cell=cell, pbc=True)
    fov = (0.0, 0.0, SIDE_A, SIDE_A)
    full = simulate_cbed(atoms, scan_positions(fov, (SCAN, SCAN)), energy_kv=200.0, semiangle_mrad=20.0,
                         gpts=GPTS, slice_thickness_A=1.0, aberrations={"C1_A": 20.0, "C3_mm": 0.0},
                         method="multislice", workers=1)
    grid = make_grid(cell, gpts=GPTS)
    reduce, _ = pattern_rebinner(grid, 2.0 / 3.0, pattern_px)
    cbed = reduce(np.fft.ifftshift(full, axes=(-2, -1)))   # the rebinner takes FFT order
    potential = build_potential(positions_A, ATOMS[1], cell, grid, 1.0)
    return SimpleNamespace(cbed=cbed, potential=projected_potential_map(potential, fov, SCAN, FWHM_A),
                           density=projected_density_map(potential, fov, SCAN, FWHM_A))


@pytest.fixture(scope="module", params=[32, 31], ids=["P32-even", "P31-odd"])
def original(request):
    return request.param, _simulate(ATOMS[0], request.param)


@pytest.mark.parametrize("op", OPS, ids=[f"t{int(o.transpose)}y{int(o.flip_y)}x{int(o.flip_x)}" for o in OPS])
def test_each_op_equals_the_simulation_of_the_turned_specimen(original, op):
    """Patterns, potential and density of the augmented original match the turned specimen's
    simulation to float precision. For even P, the edge row and column at k = -P/2 dk have no
    stored partner (module docstring): exact elsewhere, and the edge holds < 1e-3 of the intensity."""
    px, sim = original
    turned = _simulate(_turned(ATOMS[0], op), px)
    cbed, maps = sim.cbed.copy(), [sim.potential.copy(), sim.density.copy()]
    apply_op(op, cbed, maps)
    np.testing.assert_allclose(maps[0], turned.potential, rtol=0, atol=1e-4 * turned.potential.max())
    np.testing.assert_allclose(maps[1], turned.density, rtol=0, atol=1e-4 * turned.density.max())
    inner = slice(1, None) if px % 2 == 0 else slice(None)
    np.testing.assert_allclose(cbed[:, inner, inner], turned.cbed[:, inner, inner], rtol=0, atol=1e-6)
    edge = turned.cbed.sum(axis=(1, 2)) - turned.cbed[:, inner, inner].sum(axis=(1, 2))
    assert edge.max() < 1e-3
    if op != OPS[0]:   # the specimen has no symmetry: every other op changes what is recorded
        assert np.abs(turned.potential - sim.potential).max() > 0.1 * sim.potential.max()


def _square_sample(material: str = "mp-1", fov=(0.0, 0.0, 4.0, 4.0)):
    sample = make_sample(material, scan=(8, 8), px=8)
    return dataclasses.replace(sample, meta=sample.meta.replace(fov_A=tuple(fov)))


def test_draws_are_reproducible_use_all_eight_ops_and_depend_on_seed():
    meta = _square_sample().meta
    aug = SymmetryAugmentation(ON)
    draws = [aug.draw(meta.replace(sample_id=f"s{k}"), epoch, OPS) for k in range(20) for epoch in range(8)]
    assert set(draws) == set(OPS)
    again = [aug.draw(meta.replace(sample_id=f"s{k}"), epoch, OPS) for k in range(20) for epoch in range(8)]
    assert draws == again
    reseeded = SymmetryAugmentation(SymmetryAugmentationConfig(enabled=True, seed=7))
    assert draws != [reseeded.draw(meta.replace(sample_id=f"s{k}"), e, OPS) for k in range(20) for e in range(8)]


def test_unequal_scan_steps_allow_only_the_ops_that_keep_the_axes():
    """A 4 x 5 Angstrom field scanned 8 x 8 has dy != dx: a quarter turn would not map the
    probe positions onto themselves, so only identity, the two flips and the half turn remain."""
    sample = _square_sample(fov=(0.0, 0.0, 4.0, 5.0))
    ops = allowed_ops(sample.meta, sample.cbed.shape, sample.potential.shape)
    assert ops == OPS[:4] and not any(op.transpose for op in ops)
    assert allowed_ops(_square_sample().meta, (64, 8, 8), (8, 8)) == OPS


@pytest.mark.parametrize("scan, px, says", [((2, 8), 8, "scan 2x8"), ((4, 4), 8, "targets [8, 8]")])
def test_grids_that_rotations_cannot_map_are_refused(scan, px, says):
    sample = make_sample("mp-1", scan=scan, px=px)
    with pytest.raises(UserError, match=re.escape(says)):
        allowed_ops(sample.meta, sample.cbed.shape, sample.potential.shape)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A float32 store of square 8 x 8 scans with 8 x 8 targets, all in the training split."""
    path = tmp_path_factory.mktemp("symmetry") / "w0"
    cfg = stage.DataConfig(split_fractions=(1.0, 0.0, 0.0), cbed_dtype="float32")
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=cfg) as writer:
        for k in range(3):
            writer.put(_square_sample(f"mp-{k}"))
    return path


def test_the_loader_applies_the_drawn_op_to_patterns_and_targets_together(store):
    plain = stage.SampleDataset(store, "train", None, targets=("potential", "density"))
    turned = stage.SampleDataset(store, "train", None, targets=("potential", "density"), symmetry_augmentation=ON)
    aug = SymmetryAugmentation(ON)
    for epoch in range(3):
        turned.set_epoch(epoch)
        for i in range(len(plain)):
            item, ref = turned[i], plain[i]
            cbed, target = ref["cbed"].numpy().copy(), ref["target"].numpy().copy()
            meta = _square_sample().meta.replace(sample_id=turned.sample_id(i))
            apply_op(aug.draw(meta, epoch, OPS), cbed, [target[0], target[1]])
            torch.testing.assert_close(item["cbed"], torch.from_numpy(cbed), rtol=0, atol=0)
            torch.testing.assert_close(item["target"], torch.from_numpy(target), rtol=0, atol=0)


def test_default_is_off_and_bad_data_is_refused_when_the_dataset_is_built(tmp_path):
    assert stage.DataConfig().symmetry_augmentation.enabled is False
    path = tmp_path / "w0"
    with stage.StoreWriter(path, config_hash=CONFIG_HASH,
                           data_cfg=stage.DataConfig(split_fractions=(1.0, 0.0, 0.0))) as writer:
        writer.put(make_sample("mp-9", scan=(2, 2), px=8))
    stage.SampleDataset(path, "train", None, symmetry_augmentation=stage.DataConfig().symmetry_augmentation)
    with pytest.raises(UserError, match="square scan"):
        stage.SampleDataset(path, "train", None, symmetry_augmentation=ON)
    with pytest.raises(ValidationError):
        SymmetryAugmentationConfig(seed=-1)


def test_physics_input_planes_are_computed_from_the_turned_stack(store):
    """Physics inputs with symmetry augmentation (the study's combination): the dataset builds (the
    grid check looks at the stored stack, not the stack plus its extra planes), and the CoM / iCoM
    planes are those of the turned patterns, so the vector components turn with the specimen."""
    from stage.physics_dataset import PhysicsSampleDataset
    from stage.physics_inputs import physics_maps

    names = ("com_y", "com_x", "icom")
    turned = PhysicsSampleDataset(store, "train", None, ("potential", "density"), physics_inputs=names,
                                  symmetry_augmentation=ON)
    assert turned.stack_shape == (64, 8, 8) and turned.cbed_shape == (67, 8, 8)
    for epoch in range(2):
        turned.set_epoch(epoch)
        item = turned[0]["cbed"].numpy()
        maps = physics_maps(item[:64].copy(), turned._calibration(0), names, (8, 8))
        np.testing.assert_allclose(item[64:], maps, rtol=1e-5, atol=1e-6)
