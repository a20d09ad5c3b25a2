"""evaluation/outside_types/: published crystal structures of types the study never trains on (issue 30
part 5). Every CIF must stay outside: (1) pymatgen's AFLOW prototype matcher gives it no template label
of namsa.prototypes or namsa.structure_type.LIBRARY_AFLOW; (2) no library structure matches it with any
element mapping (the study's generated materials are substitutions into those templates, so they keep
their types); (3) its bonds pass the checks the templates pass; (4) configs/outside-types.yaml plans it
at the study's physics (the physics hash of configs/gpu-study.yaml). Each file's source is in SOURCES.md.
"""
from __future__ import annotations

import itertools
import re
import warnings
from functools import lru_cache
from pathlib import Path

import pytest

from namsa import library, prototypes
from namsa.kirkland import is_light
from namsa.plan import plan_samples
from namsa.structure_io import load_structure
from namsa.structure_type import LIBRARY_AFLOW
from stage.splits import split_of

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "evaluation" / "outside_types"
CONFIG = REPO / "configs" / "outside-types.yaml"
STEMS = sorted(p.stem for p in FOLDER.glob("*.cif"))


@lru_cache(maxsize=1)
def _structures() -> dict:
    """material id (file stem) -> structure, through the loader the simulator uses (it refuses partial
    occupancies, unknown elements and unreadable files)."""
    return {stem: load_structure(FOLDER / f"{stem}.cif") for stem in STEMS}


def _anonymous(structure) -> str:
    """The reduced formula with the elements anonymised: two structures an element mapping can match
    have the same one, so comparing it first skips the matcher on the pairs that cannot match."""
    return structure.composition.anonymized_formula


def _matcher():
    from pymatgen.analysis.structure_matcher import StructureMatcher

    return StructureMatcher()   # pymatgen's defaults, as the AFLOW matcher starts with


def test_the_set_has_thirty_types_and_forty_percent_light():
    light = [stem for stem, s in _structures().items() if is_light([e.symbol for e in s.composition])]
    assert len(STEMS) >= 30, STEMS
    assert len(light) / len(STEMS) >= 0.4, light


def test_sources_name_every_file_and_only_those():
    text = (FOLDER / "SOURCES.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)\.cif` \|.*$", text, re.M)}
    assert sorted(rows) == STEMS
    for stem, row in rows.items():   # a database id, and a publication with its year, on every row
        database_id, publication = [cell.strip() for cell in row.split("|")[6:8]]
        assert re.match(r"(COD|AMCSD|Materials Project) ", database_id), row
        assert re.search(r"\b(1[89]|20)\d\d\b", publication), row
        assert f"data_{stem}" in (FOLDER / f"{stem}.cif").read_text().splitlines()   # the data block names the file


def test_no_aflow_template_or_library_prototype_label_matches():
    """(1) The matcher namsa.structure_type labels CIFs with (AflowPrototypeMatcher is this class over
    the same library), built here from pymatgen's data so the test fails loudly if that data goes."""
    import pandas as pd
    from pymatgen.analysis.prototypes import AFLOW_PROTOTYPE_LIBRARY, PrototypeDatabaseMatcher

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matcher = PrototypeDatabaseMatcher(pd.DataFrame(AFLOW_PROTOTYPE_LIBRARY))
        known = {prototypes.aflow_label(t) for t in prototypes.all_ids()} | set(LIBRARY_AFLOW.values())
        inside = {stem: labels for stem, s in _structures().items()
                  if (labels := {m["tags"]["aflow"] for m in matcher.get_prototypes(s) or []} & known)}
    assert not inside, f"structure types the study trains on: {inside}"


def test_no_library_structure_is_the_same_type():
    """(2) Any element mapping: a library rocksalt matches every rocksalt CIF."""
    sm, lib = _matcher(), {i: library.get(i) for i in library.list_ids()}
    inside = [(stem, lib_id) for stem, s in _structures().items() for lib_id, t in lib.items()
              if _anonymous(t) == _anonymous(s) and sm.fit_anonymous(t, s)]
    assert not inside


def test_no_two_files_are_the_same_type():
    sm, structures = _matcher(), _structures()
    pairs = itertools.combinations(STEMS, 2)
    twins = [(a, b) for a, b in pairs if _anonymous(structures[a]) == _anonymous(structures[b])
             and sm.fit_anonymous(structures[a], structures[b])]
    assert not twins


@pytest.mark.slow
def test_no_two_files_share_an_atomic_framework():
    """Stricter than a type: the same sites whatever their elements (cordierite was left out as beryl's)."""
    from pymatgen.analysis.structure_matcher import FrameworkComparator, StructureMatcher

    sm, structures = StructureMatcher(comparator=FrameworkComparator()), _structures()
    assert not [(a, b) for a, b in itertools.combinations(STEMS, 2) if sm.fit(structures[a], structures[b])]


def test_bonds_are_plausible():
    """(3) The generator's own checks on its templates: no clash, ionic bonds and bond valences in range."""
    problems = {stem: p for stem, s in _structures().items() if (p := prototypes.bond_problem(s))}
    assert not problems


def test_the_config_plans_every_file_at_the_studys_physics(monkeypatch):
    """(4) cif_dir is relative to the working directory, as the commands in the config run it."""
    from workflow.config import load_config

    monkeypatch.chdir(REPO)
    cfg, gpu = load_config(CONFIG), load_config(REPO / "configs" / "gpu-study.yaml")
    sim = cfg.simulation
    # only the CIFs, and every sample held out
    assert sim.materials == [] and sim.generator.count == 0 and Path(sim.cif_dir).resolve() == FOLDER
    assert cfg.evaluation.split == "test" and not cfg.evaluation.mean_baseline
    assert {split_of(stem, cfg.data.split_fractions, cfg.data.split_seed) for stem in STEMS} == {"test"}
    # the hash covers every field that changes a sample (not the plan, device or memory)
    assert sim.physics_hash() == gpu.simulation.physics_hash()
    assert (sim.zone_axes, sim.max_zone_axes, sim.variants) == (gpu.simulation.zone_axes, gpu.simulation.max_zone_axes,
                                                                gpu.simulation.variants)
    plan = plan_samples(sim)
    assert plan.failures == []
    assert sorted({spec.material_id for spec in plan.specs}) == STEMS
