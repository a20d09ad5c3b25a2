"""Every random stream of a sample, numbered in one table so that no two draws share a stream.

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


class AugmentationStream(str, Enum):
    """The training-time draws of one sample in one epoch (stage.dose.augmentation_rng): the value
    prefixes the sample id in the hash, so the two never share a stream."""

    DOSE = ""
    SYMMETRY = "symmetry:"


def sample_rng(seed: int, stream: SampleStream, *index: int) -> np.random.Generator:
    """The generator of ``stream`` (and its ``index``, e.g. the phonon configuration) of the sample
    with ``seed``."""
    return np.random.default_rng([int(seed), int(stream), *(int(i) for i in index)])


def generator_rng(seed: int, stream: GeneratorStream) -> np.random.Generator:
    """The generator of the recipe draws of ``stream`` for ``generator.seed``."""
    return np.random.default_rng([int(seed), int(stream)])
