"""The random streams of a sample (namsa.random_streams): one table, no two draws on one stream.

Until physics schema 3, phonon configuration 1 drew from the thickness stream and configuration 2
from the shot-noise stream (and the phonon fraction shared the noise stream too)."""
from __future__ import annotations

import itertools

import numpy as np

from namsa import SimulationConfig, load_structure
from namsa.detector import poisson_noise
from namsa.random_streams import AugmentationStream, SampleStream, sample_rng
from namsa.supercell import orient_supercell
from namsa.thermal import debye_waller_sigma_A, thermal_displace
from namsa.variations import phonon_configurations, specimen_thickness_A
from stage.dose import augmentation_rng

SEED = 12345


def _first_draws(rng: np.random.Generator) -> tuple[float, ...]:
    return tuple(rng.uniform(size=4))


def test_every_stream_of_a_sample_draws_its_own_numbers():
    keys = [(s,) for s in SampleStream if s is not SampleStream.PHONON_CONFIGURATION]
    keys += [(SampleStream.PHONON_CONFIGURATION, k) for k in range(1, 9)]
    draws = {key: _first_draws(sample_rng(SEED, *key)) for key in keys}
    draws["main"] = _first_draws(np.random.default_rng(SEED))
    for a, b in itertools.combinations(draws, 2):
        assert draws[a] != draws[b], (a, b)


def test_the_thickness_and_the_phonon_configurations_use_their_table_streams():
    cfg = SimulationConfig(phonon_configs=3, variations={"frozen_phonon": True, "thickness_range_A": [10, 50]})
    expected = sample_rng(SEED, SampleStream.THICKNESS).uniform(10, 50)
    assert specimen_thickness_A(cfg, SEED) == expected
    supercell = orient_supercell(load_structure("Si-diamond"), (1, 1, 0), 8.0, 6.0)
    configs = phonon_configurations(supercell, cfg, np.random.default_rng(SEED), SEED)
    assert len(configs) == 3
    sigma = {"Si": debye_waller_sigma_A("Si")}
    for k in (1, 2):
        again = thermal_displace(supercell, sample_rng(SEED, SampleStream.PHONON_CONFIGURATION, k), sigma)
        np.testing.assert_array_equal(configs[k].positions_A, again.positions_A)
    # configuration 1 is not the thickness stream's draw (schema 2's collision)
    collided = thermal_displace(supercell, np.random.default_rng([SEED, int(SampleStream.THICKNESS)]), sigma)
    assert not np.array_equal(configs[1].positions_A, collided.positions_A)


def test_the_shot_noise_has_its_own_stream():
    cbed = np.full((2, 8, 8), 1 / 64, dtype=np.float32)
    noisy = poisson_noise(cbed, 1000.0, SEED)
    counts = sample_rng(SEED, SampleStream.SHOT_NOISE).poisson(cbed.astype(np.float64) * 1000.0)
    np.testing.assert_array_equal(noisy, (counts / 1000.0).astype(np.float32))


def test_the_augmentations_of_one_sample_draw_apart():
    dose = _first_draws(augmentation_rng(0, 3, "Si-diamond__1_1_0__v0__abc"))
    symmetry = _first_draws(augmentation_rng(0, 3, "Si-diamond__1_1_0__v0__abc", AugmentationStream.SYMMETRY))
    assert dose != symmetry
    # the symmetry stream keeps its pre-table key, so training draws did not change
    assert symmetry == _first_draws(augmentation_rng(0, 3, "symmetry:Si-diamond__1_1_0__v0__abc"))
