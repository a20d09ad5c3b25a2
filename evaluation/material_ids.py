"""What a material id and a sample id say, in words a reader of the report can check.

The ids are made elsewhere, in the grammar of `namsa.material_id`: library ids
``<formula>-<prototype>`` in `namsa.library`, generated ids ``<template>:<new elements>:<lattice
scale>`` in `namsa.generator` (the id is the recipe), and
sample ids ``<material>__<u>_<v>_<w>__v<variant>__<hash>`` in `namsa.material_id.sample_id`; the
variant indexes a sample's draws of thickness, phonons, tilt and defocus (`namsa.variations`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from namsa import library
from namsa.material_id import is_generated_id, split_generated_id, split_sample_id

#: the three id forms (kind, form, meaning), as the report's "Materials" section explains them.
ID_FORMS: tuple[tuple[str, str, str], ...] = (
    ("library material", "<formula>-<prototype>",
     "e.g. Si-diamond: a structure of the built-in library (namsa/library.py), lattice from the cited literature"),
    ("generated material", "<template>:<new elements>:<lattice scale>",
     "e.g. NaCl-rocksalt:K,Br:1.0731: the template library structure with its distinct elements replaced, in "
     "order of first appearance, by the listed ones (Na→K, Cl→Br) and its lattice scaled by the factor "
     "(namsa/generator.py); the id is the recipe, so the structure can be rebuilt from it"),
    ("sample", "<material>__<u>_<v>_<w>__v<variant>__<hash>",
     "that material seen along zone axis [u v w]; variant numbers the draws of thickness, frozen phonons, tilt "
     "and defocus for it (namsa/variations.py); hash is the first 12 hex digits of the physics configuration's "
     "hash (namsa/material_id.py)"),
)


def describe_material(material_id: str, formula: str = "") -> dict[str, str]:
    """{id, formula, prototype, made}: ``made`` says how the structure was built from the id."""
    material_id = str(material_id)
    if is_generated_id(material_id):
        return _generated(material_id, formula)
    proto = _prototype(material_id)
    if proto is None:
        return {"id": material_id, "formula": formula or "–", "prototype": "–",
                "made": "a structure read from a CIF file (simulation.cif_dir), named after the file"}
    return {"id": material_id, "formula": formula or material_id.split("-")[0], "prototype": proto,
            "made": "built-in library structure"}


def _generated(material_id: str, formula: str) -> dict[str, str]:
    template, new, scale = split_generated_id(material_id)
    old = _template_elements(template)
    proto = _prototype(template)
    if old is None or proto is None:
        made = f"generated from template {template} with elements {','.join(new)}, lattice × {scale}"
        return {"id": material_id, "formula": formula or "–", "prototype": "–", "made": made}
    swaps = ", ".join(f"{a}→{b}" for a, b in zip(old, new))
    return {"id": material_id, "formula": formula or "–", "prototype": proto,
            "made": f"library {template} with {swaps}, lattice × {scale}"}


@lru_cache(maxsize=None)
def _prototype(structure_id: str) -> str | None:
    """The library's prototype name of ``structure_id``, None when it is not a library id."""
    try:
        return str(library.info(structure_id)["prototype"])
    except library.UnknownStructureIdError:
        return None


@lru_cache(maxsize=None)
def _template_elements(template: str) -> tuple[str, ...] | None:
    """Distinct elements of a library structure in order of first appearance (the order a generated
    id lists their replacements in), None when it is not a library id."""
    try:
        structure = library.get(template)
    except library.UnknownStructureIdError:
        return None
    return tuple(dict.fromkeys(site.specie.symbol for site in structure))


def describe_sample(sample_id: str) -> dict[str, Any]:
    """{material, zone_axis, variant, hash} parsed from a sample id ({} when it has another form)."""
    try:
        parts = split_sample_id(sample_id)
    except ValueError:
        return {}
    u, v, w = parts.zone_axis
    return {"material": parts.material_id, "zone_axis": f"[{u} {v} {w}]", "variant": str(parts.variant),
            "hash": parts.digest}
