"""The structure type (prototype) of a material, so splits can hold out whole structure types.

`prototype_label` names the structure type of a material id as an AFLOW prototype label
(``"AB_cF8_225_a_b"`` for rocksalt), so the same type gets the same label whichever way it
entered the plan:

- library ids: the library's own ``prototype`` tag (``"rocksalt"``), written as its AFLOW label
  through `LIBRARY_AFLOW` (the tag itself when a new tag has no entry there yet);
- generated ids (``"NaCl-rocksalt:K,Br:1.0731"``): the label of their template, the part before
  the first ``":"`` (an element substitution keeps the structure type; an AFLOW template
  (`namsa.prototypes`) is its AFLOW label, without the ``~n`` that tells apart pymatgen's repeats);
- anything else (CIF stems) with its structure at hand: pymatgen's AFLOW prototype matcher
  (``pymatgen.analysis.prototypes.AflowPrototypeMatcher``, 0.1-1.1 s per structure measured on the
  library, hence cached per material id), else the material id itself (its own type).

The matcher is paid for only when a label is asked for: importing pymatgen's AFLOW prototype data
and building the matcher takes 3-9 s, most of the first simulation of a CIF when it was computed
for every sample. So the simulator records `cheap_label` (library and generated ids; None for a
CIF) and `remember`s the structure of a CIF; `prototype_label(material_id)` without a structure
then matches the remembered one, once per material id (a split by structure type asks for it
when the sample is stored: stage.splits.split_key, in the process that simulated it).

`LIBRARY_AFLOW` was read off the matcher run on every library structure (the library's tags are
used rather than the matcher's answer because the matcher misnames two library entries: inverse
spinel Fe3O4 and Co3O4 come back as tetragonal hausmannite, RuO2 as no match).
"""
from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any

from . import library, prototypes
from .material_id import is_generated_id, template_of

#: library prototype tag -> AFLOW prototype label (AflowPrototypeMatcher on the library structures)
LIBRARY_AFLOW: dict[str, str] = {
    "fcc": "A_cF4_225_a", "bcc": "A_cI2_229_a", "hcp": "A_hP2_194_c", "diamond": "A_cF8_227_a",
    "zincblende": "AB_cF8_216_c_a", "rocksalt": "AB_cF8_225_a_b", "cesium chloride": "AB_cP2_221_b_a",
    "perovskite": "AB3C_cP5_221_a_c_b", "fluorite": "AB2_cF12_225_a_c", "rutile": "A2B_tP6_136_f_a",
    "spinel": "A2BC4_cF56_227_d_a_e", "corundum": "A2B3_hR10_167_c_e", "wurtzite": "AB_hP4_186_b_b",
    "graphite (2H)": "A_hP4_194_bc", "hexagonal BN": "AB_hP4_194_c_d", "MoS2 (2H)": "AB2_hP6_194_c_f",
    "tetradymite": "A2B3_hR5_166_c_ac", "CdI2 (1T)": "AB2_hP3_164_a_d", "AlB2": "AB2_hP3_191_a_d",
    "alpha-NaFeO2 (layered rocksalt)": "ABC2_hR4_166_a_b_c",
}


def prototype_label(material_id: str, structure: Any = None) -> str:
    """The structure-type label of ``material_id`` (see the module docstring for the rules); without
    ``structure``, a structure `remember`ed for it is matched."""
    material_id = str(material_id)
    label = cheap_label(material_id)
    if label is not None:
        return label
    structure = structure if structure is not None else _REMEMBERED.get(material_id)
    if structure is None:
        return material_id
    return _matched_label(material_id, structure)


def cheap_label(material_id: str) -> str | None:
    """The label of a library or generated id, which needs no matcher; None for anything else."""
    material_id = str(material_id)
    if is_generated_id(material_id):
        template = template_of(material_id)
        return _library_label(template) if template in _library_ids() else prototypes.aflow_label(template)
    if material_id in _library_ids():
        return _library_label(material_id)
    return None


#: structures whose label has not been asked for yet: material id -> structure (ids name one structure)
_REMEMBERED: dict[str, Any] = {}


def remember(material_id: str, structure: Any) -> None:
    """Keep ``structure`` so that a later `prototype_label(material_id)` can match it (nothing is
    matched now: most runs never ask)."""
    _REMEMBERED.setdefault(str(material_id), structure)


@lru_cache(maxsize=1)
def _library_ids() -> frozenset[str]:
    return frozenset(library.list_ids())


def _library_label(structure_id: str) -> str:
    tag = library.info(structure_id)["prototype"]
    return LIBRARY_AFLOW.get(tag, tag)


_MATCHED: dict[str, str] = {}


def _matched_label(material_id: str, structure: Any) -> str:
    """AFLOW label of a structure outside the library, cached per material id (ids name one
    structure); the material id when the matcher knows no prototype for it."""
    if material_id not in _MATCHED:
        matches = _matcher().get_prototypes(structure) if _matcher() is not None else None
        _MATCHED[material_id] = str(matches[0]["tags"]["aflow"]) if matches else material_id
        _REMEMBERED.pop(material_id, None)  # labelled: the structure is not needed again
    return _MATCHED[material_id]


@lru_cache(maxsize=1)
def _matcher() -> Any:
    """pymatgen's AFLOW matcher (1-10 s to build, once per process), or None where this pymatgen no longer ships it."""
    try:
        from pymatgen.analysis.prototypes import AflowPrototypeMatcher
    except ImportError:
        return None
    with warnings.catch_warnings():   # deprecated in favour of a matcher that needs its own database
        warnings.simplefilter("ignore", DeprecationWarning)
        return AflowPrototypeMatcher()
