"""The random streams of a sample (namsa.random_streams): one table, no two draws on one stream.

Until physics schema 3, phonon configuration 1 drew from the thickness stream and configuration 2
from the shot-noise stream (and the phonon fraction shared the noise stream too)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from namsa import SimulationConfig, load_structure
from namsa.detector import poisson_noise
from namsa.random_streams import (MAX_SEED, AugmentationStream, GeneratorStream, SampleStream, TrainingStream,
                                  sample_rng, training_seed)
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


def test_every_stream_number_of_the_table_is_distinct():
    numbers = [int(s) for table in (SampleStream, GeneratorStream, TrainingStream) for s in table]
    assert len(numbers) == len(set(numbers))
    assert max(SampleStream) < min(GeneratorStream) <= max(GeneratorStream) < min(TrainingStream)
    assert len({s.value for s in AugmentationStream}) == len(AugmentationStream)


def test_the_training_order_keeps_its_seed_from_before_the_table():
    """Runs of up to 101 ranks shuffle as they did, so a trained run's batches (and `make demo`) stay."""
    for seed, epoch, rank, world_size in itertools.product((0, 1, 7, MAX_SEED), (0, 1, 99, 5000), (0, 1, 2), (3, 101)):
        before = (seed * 1_000_003 + epoch * 101 + rank) % 2**64
        assert training_seed(seed, TrainingStream.ORDER, epoch, rank, world_size) == before


def _training_seeds(seed: int, epochs: int, world_size: int) -> list[tuple[tuple, int]]:
    """(what, torch seed) of every generator a run of ``seed`` seeds in ``epochs`` epochs on ``world_size`` ranks."""
    ranks = range(world_size)
    uses = [((TrainingStream.ORDER, e, r), training_seed(seed, TrainingStream.ORDER, e, r, world_size))
            for e in range(epochs) for r in ranks]
    uses += [((stream, e), training_seed(seed, stream, e))
             for stream in (TrainingStream.SHARED_ORDER, TrainingStream.LOADER_WORKERS) for e in range(epochs)]
    uses += [((TrainingStream.DROPOUT, r), training_seed(seed, TrainingStream.DROPOUT, 0, r, world_size))
             for r in ranks]
    # a resident run's batch noise (stage.resident_draws.batch_noise_seed): the batch's ordinal as the epoch
    uses += [((TrainingStream.BATCH_SHOT_NOISE, e, r), training_seed(seed, TrainingStream.BATCH_SHOT_NOISE, e, r,
                                                                      world_size)) for e in range(epochs) for r in ranks]
    return uses + [((TrainingStream.DEV_LOADER,), training_seed(seed, TrainingStream.DEV_LOADER))]


SEEDS = (0, 1, 2, 3, 7, 2**40, 2**62, MAX_SEED)


@pytest.mark.parametrize("world_size, epochs", [(1, 400), (2, 300), (8, 120), (128, 20)])
def test_no_two_training_generators_share_a_seed(world_size, epochs):
    """Over epochs, ranks (more than 101 too) and seeds, no seed of one training stream is another's,
    nor one of the same stream at another epoch or rank."""
    seen: dict[int, tuple] = {}
    for seed in SEEDS:
        for use, value in _training_seeds(seed, epochs, world_size):
            assert 0 <= value < 2**64
            assert value not in seen, f"{(seed, use)} has the seed of {seen[value]}"
            seen[value] = (seed, use)


def test_the_main_stream_shares_a_seed_only_with_seed_0_s_first_shuffle():
    """torch.manual_seed(training.seed) (the initial weights): its one share within a run is kept (see
    namsa.random_streams), the loader's, dev loader's, shared sampler's and dropout's are gone."""
    for seed in SEEDS:
        shares = [use for use, value in _training_seeds(seed, 300, 4) if value == seed]
        assert shares == ([(TrainingStream.ORDER, 0, 0)] if seed == 0 else []), seed
