"""Train/dev/test assignment by material, from a hash: independent writers agree without talking."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

from namsa.errors import UserError

SPLITS: tuple[str, str, str] = ("train", "dev", "test")


def split_of(material_id: str, fractions: Sequence[float] = (0.90, 0.05, 0.05), seed: int = 0) -> str:
    """The split ("train" | "dev" | "test") of every sample of ``material_id``.

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
