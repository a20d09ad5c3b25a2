"""The grammar of material and sample ids: one owner for making and reading them.

- library ids ``<formula>-<prototype>`` (namsa.library) and CIF stems are opaque names;
- generated ids ``<template>:<new elements>:<lattice scale>`` (namsa.generator): the id is the
  recipe, e.g. ``NaCl-rocksalt:K,Br:1.0731``;
- sample ids ``<material>__<u>_<v>_<w>__v<variant>__<hash>`` (namsa.sample), hash = the first 12
  hex digits of the physics configuration's hash.

This module only splits and joins text; whether a template exists or an element is valid is
decided by the modules that own those facts (namsa.generator checks a parsed recipe).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

#: separates the parts of a generated id
SEPARATOR = ":"
#: separates the parts of a sample id
SAMPLE_SEPARATOR = "__"
#: the form of a generated id, for messages
GENERATED_FORM = "'NaCl-rocksalt:K,Br:1.0731' (template id, new elements, lattice scale)"


class GeneratedId(NamedTuple):
    """The three parts of a generated id, as text (the scale is parsed by its owner)."""

    template: str
    elements: list[str]
    scale: str


class SampleIdParts(NamedTuple):
    material_id: str
    zone_axis: tuple[int, int, int]
    variant: int
    digest: str


def is_generated_id(material_id: object) -> bool:
    """True when ``material_id`` has the ``template:elements:scale`` form of a generated material."""
    return isinstance(material_id, str) and material_id.count(SEPARATOR) == 2


def generated_id(template: str, elements: Sequence[str], scale: float) -> str:
    """The id of the recipe: ``template`` with its distinct elements replaced, in order of first
    appearance, by ``elements``, and its lattice scaled by ``scale`` (4 decimals)."""
    return SEPARATOR.join((template, ",".join(elements), f"{scale:.4f}"))


def split_generated_id(material_id: str) -> GeneratedId:
    """The parts of a generated id; ValueError when it does not have the form."""
    parts = str(material_id).split(SEPARATOR)
    if len(parts) != 3:
        raise ValueError(f"{material_id!r} is not a generated material id; generated ids look like {GENERATED_FORM}")
    return GeneratedId(parts[0], parts[1].split(","), parts[2])


def template_of(material_id: str) -> str:
    """The template id of a generated id, ``material_id`` itself for any other id."""
    return split_generated_id(material_id).template if is_generated_id(material_id) else str(material_id)


def sample_id(material_id: str, zone_axis: Sequence[int], variant: int, config_hash: str) -> str:
    """Deterministic, human-readable sample identity.

    The same (material, zone axis, variant, physics config) always gives the same id, so
    writing a sample twice is a no-op and every stage is resumable.
    """
    u, v, w = (int(i) for i in zone_axis)
    return f"{material_id}{SAMPLE_SEPARATOR}{u}_{v}_{w}{SAMPLE_SEPARATOR}v{int(variant)}{SAMPLE_SEPARATOR}{config_hash[:12]}"


def split_sample_id(sid: str) -> SampleIdParts:
    """The parts of an id made by :func:`sample_id`. ValueError for anything else."""
    try:
        material_id, axis, variant, digest = str(sid).rsplit(SAMPLE_SEPARATOR, 3)
        u, v, w = (int(i) for i in axis.split("_"))
        if not (material_id and variant.startswith("v") and digest):
            raise ValueError
        return SampleIdParts(material_id, (u, v, w), int(variant[1:]), digest)
    except ValueError:
        raise ValueError(f"{sid!r} is not a sample id (MATERIAL__U_V_W__vN__HASH)") from None


def parse_sample_id(sid: str) -> tuple[str, tuple[int, int, int], int]:
    """(material_id, zone_axis, variant) of a sample id: what
    ``simulate_sample(material_id, zone_axis, cfg, variant=variant)`` needs to make that sample again
    (with the config whose physics hash the id ends in). ValueError for anything else."""
    parts = split_sample_id(sid)
    return parts.material_id, parts.zone_axis, parts.variant
