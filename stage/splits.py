"""Train/dev/test assignment by material or by structure type, from a hash: independent writers
agree without talking."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

from namsa.errors import UserError
from namsa.sample_meta import SampleMeta
from namsa.structure_type import prototype_label

SPLITS: tuple[str, str, str] = ("train", "dev", "test")
#: what one split holds whole: a material (every orientation and variant of it) or a structure
#: type (every material of that prototype, `namsa.structure_type.prototype_label`)
SplitBy = Literal["material", "prototype"]


def split_of(material_id: str, fractions: Sequence[float] = (0.90, 0.05, 0.05), seed: int = 0) -> str:
    """The split ("train" | "dev" | "test") of every sample of ``material_id`` (or of every
    material of a structure type, given its prototype label: see `sample_split`).

    A pure function of its arguments: sha256(seed, material id) is mapped to a uniform number in
    [0, 1) and compared with the cumulative ``fractions`` (train, dev, test). Every orientation and
    variant of a material therefore lands in the same split, so no material leaks from training
    into evaluation (Laanait et al. 2019 split 90/5/5).
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise UserError(f"split fractions {tuple(fractions)} must be three non-negative numbers "
                        f"(train, dev, test) summing to 1, e.g. (0.9, 0.05, 0.05)")
    digest = hashlib.sha256(f"{int(seed)}\x00{material_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    train, dev, _ = fractions
    if u < train:
        return "train"
    if u < train + dev:
        return "dev"
    return "test"


def split_key(meta: SampleMeta, by: SplitBy = "material") -> str:
    """What a sample's split is drawn from: its material id, or its structure type (the
    ``prototype`` the simulator recorded in ``meta``, else the label of its material id: for a CIF,
    whose label the simulator leaves to whoever asks, the AFLOW match of the structure it
    remembered, computed here once per material: namsa.structure_type)."""
    material_id = str(meta.material_id)
    if by == "material":
        return material_id
    return str(meta.prototype or prototype_label(material_id))


def sample_split(meta: SampleMeta, fractions: Sequence[float], seed: int, by: SplitBy = "material") -> str:
    """The split of the sample with ``meta``: `split_of` its `split_key`, so a material (or, with
    ``by="prototype"``, a whole structure type) lands in exactly one split."""
    return split_of(split_key(meta, by), fractions, seed)
