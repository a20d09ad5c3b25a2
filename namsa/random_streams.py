"""Every random stream (of a sample, of the generator, of a training run), numbered in one table so
that no two draws share a stream.

A sample's draws are functions of its seed (`namsa.variations.sample_seed`) only, so any worker
on any machine makes the same sample. The main stream, ``numpy.random.default_rng(seed)``, draws
the first frozen-phonon configuration, then the beam tilt and the defocus (in that order:
`namsa.variations`). Every other draw has a stream of its own, ``default_rng([seed, stream,
*index])``, so turning one variation on or off leaves the others' draws as they were.

Until physics schema 3 the thickness drew from [seed, 1], the phonon fraction and the shot noise
both from [seed, 2], and phonon configuration k from [seed, k]: configuration 1 reused the thickness
stream and configuration 2 the noise stream. The training-time augmentations (stage) draw from
(seed, epoch, sample id) under a name of their own (`AugmentationStream`).

The generator's recipes (`namsa.generator.generated_ids`) draw from ``default_rng(generator.seed)``
and, for each further kind of material, from ``default_rng([generator.seed, stream])`` with a
`GeneratorStream` number above 100, so no generator stream is ever a sample's stream.

A training run seeds torch generators, which take one 64-bit integer, not numpy's list: its main
stream is ``torch.manual_seed(training.seed)`` (the initial weights, the same on every rank), and
every other generator is seeded with `training_seed` of its `TrainingStream` (numbered above 200).
Before these numbers, the loader's generator of epoch e (seed * 1_000_003 + e) had the training
order's seed of epoch e // 101 on rank e % 101 (the same seed in epoch 0), the dev loader and the
shared sampler's epoch 0 had the main stream's (seed), and with seed r + 1 the dropout of rank r
(seed + 1_000_003 * (r + 1)) had the training order's of rank r + 1 in epoch 0. Those took new
seeds: a fresh run of a preset with dropout (small, paper) draws other masks; the loaders' seeds are
only their workers' base seeds, which nothing draws from. The training order kept its seed, so runs
train on the same batches as before (the scan preset of the quickstart and the study, which has no
dropout, trains as before). Its one share left is with the main stream at seed 0 (epoch 0, rank 0),
kept because every run of the default seed has trained so: the initial weights and the first
shuffle are then drawn from one stream.
"""
from __future__ import annotations

from enum import Enum, IntEnum

import numpy as np

#: the largest seed of any config section: seeds are stored as JSON integers and fed to numpy (no
#: negative seeds) and to torch (64-bit), so 0 <= seed <= 2**63 - 1 everywhere
MAX_SEED = 2**63 - 1


class SampleStream(IntEnum):
    """The streams of one simulated sample, besides its main stream."""

    THICKNESS = 1                # the specimen thickness over variations.thickness_range_A
    PHONON_FRACTION = 2          # whether this sample gets frozen phonons (frozen_phonon_fraction)
    SHOT_NOISE = 3               # the Poisson counts of variations.dose_e_per_A2
    PHONON_CONFIGURATION = 4     # configuration k >= 1 of the frozen-phonon average: [seed, 4, k]
    THIN_SHARE = 5               # whether the thickness is drawn below variations.thin_below_A (thin_fraction)
    CAMERA = 6                   # namsa.camera.record: [seed, 6, 0] the electrons, [seed, 6, 1] the read noise


class GeneratorStream(IntEnum):
    """The streams of the generator's recipe draws, besides its main stream (numbered above 100)."""

    LIGHT_MATERIALS = 101        # the materials of generator.light_fraction (light-element pool)


class TrainingStream(IntEnum):
    """The torch generators of a training run besides its main stream (numbered above 200)."""

    ORDER = 201           # stage.sampler: the shuffle of one rank's shard in one epoch (the training order)
    SHARED_ORDER = 202    # stage.sampler, data.shard_mode shared: the one shuffle of all samples in one epoch
    LOADER_WORKERS = 203  # the train loader's generator in one epoch: its workers' base seeds
    DEV_LOADER = 204      # the dev loader's generator: its workers' base seeds
    DROPOUT = 205         # one rank's global generators once the model is built: its dropout masks
    BATCH_SHOT_NOISE = 206  # stage.resident: the Poisson counts of one resident training batch, seeded with
    #                         the dose augmentation's seed and the batch's ordinal in the run as the epoch


#: the training order's seed before the table, seed * 1_000_003 + epoch * 101 + rank: `training_seed` keeps it
SEED_FACTOR, EPOCH_SLOTS = 1_000_003, 101
#: the bit where the band of a training stream other than ORDER starts (epoch and rank lie below it)
STREAM_SHIFT = 60


class AugmentationStream(str, Enum):
    """The training-time draws of one sample in one epoch (stage.dose.augmentation_rng): the value
    prefixes the sample id in the hash, so the two never share a stream."""

    DOSE = ""
    SYMMETRY = "symmetry:"
    CAMERA = "camera:"   # stage.camera_augmentation: whether an integrating camera, its point spread and read noise


def sample_rng(seed: int, stream: SampleStream, *index: int) -> np.random.Generator:
    """The generator of ``stream`` (and its ``index``, e.g. the phonon configuration) of the sample
    with ``seed``."""
    return np.random.default_rng([int(seed), int(stream), *(int(i) for i in index)])


def generator_rng(seed: int, stream: GeneratorStream) -> np.random.Generator:
    """The generator of the recipe draws of ``stream`` for ``generator.seed``."""
    return np.random.default_rng([int(seed), int(stream)])


def training_seed(seed: int, stream: TrainingStream, epoch: int = 0, rank: int = 0, world_size: int = 1) -> int:
    """The 64-bit torch seed of ``stream`` of the training run with ``training.seed`` ``seed``, in
    ``epoch`` on ``rank`` of ``world_size`` ranks.

    With p = epoch * max(101, world_size) + rank (below 2**60: 10**16 epochs), ORDER's seed is
    seed * 1_000_003 + p (mod 2**64): on up to 101 ranks the training order's seed from before the
    table. Every other stream lies in a band of its own above it, seed * 1_000_003 + (stream - ORDER)
    * 2**60 + (p + m) mod 2**60, m a hash of (seed, stream): within one run no two streams, and no
    two (epoch, rank) of one stream, share a seed, and across seeds the bands do not line up (a
    plain offset made seed 2**62's dropout seed 0's first shuffle).
    """
    position = int(epoch) * max(EPOCH_SLOTS, int(world_size)) + int(rank)
    base = int(seed) * SEED_FACTOR
    if stream == TrainingStream.ORDER:
        return (base + position) % 2**64
    band = (int(stream) - TrainingStream.ORDER) << STREAM_SHIFT
    mix = int(np.random.SeedSequence([int(seed), int(stream)]).generate_state(1, np.uint64)[0])
    return (base + band + (position + mix) % 2**STREAM_SHIFT) % 2**64
