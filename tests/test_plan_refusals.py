"""A material whose zone axis cannot be built is refused when the plan is made, not when it is simulated
(issue 41, item 3). The GPU study planned 600 generated materials and kept 584: 16 found no zone axis.
Five were rhombohedral AFLOW templates given in a primitive setting, whose [0001] reads [1, 1, -3] there,
beyond the search's index 2: the search now tries the standard conventional cell's low-index axes when
the structure's own ones fail. The other eleven (monoclinic and triclinic templates needing more than 2%
strain) are refused as they are drawn and replaced by the next draw, so generator.count materials come
out; explicit axes are checked with the cell choice `orient_supercell` makes. Every planned sample is
then stored, and a stored plan (`workflow.plan_cache`) holds the refusals."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from namsa import SimulationConfig, generator
from namsa.plan import plan_samples
from namsa.supercell import orient_supercell
from workflow import data_runners, plan_cache
from workflow.config import load_config
from workflow.plan_signature import KEY_ENV, MAC_FIELD, plan_secret, signed

MICRO = Path(__file__).resolve().parents[1] / "configs" / "micro.yaml"
#: micro's sizes (4 x 4 scans, 16 px, an 8 A cell 16 A thick): a sample in about a second
SIZES = ("simulation.cell_lateral_A=8", "simulation.thickness_A=16")
#: triclinic (the PI2 template, P-1) with Br and S: no axis of index <= 2, in its own cell or its
#: standard one, has an orthogonal cell within 2% strain at 20 A (tests/test_prototypes.py)
UNORIENTABLE = "A2B_aP6_2_2i_i:Br,S:1.1288"
#: three generated materials from two templates, one a triclinic one: the plain draw's second material,
#: A2B_aP6_2_2i_i:Y,Tm:1.8144, finds no axis
GENERATOR = {"count": 3, "seed": 2, "templates": ["A2B_aP6_2_2i_i", "Cu-fcc"], "sources": ["library", "aflow"]}


@pytest.fixture(autouse=True)
def plan_key_file(tmp_path_factory, monkeypatch):
    """A signing key of the test's own (workflow.plan_signature), not the user's ~/.cache one."""
    monkeypatch.setenv(KEY_ENV, str(tmp_path_factory.mktemp("key") / "plan-cache.key"))


def micro(*overrides: str):
    return load_config(MICRO, [*SIZES, *overrides])


def simulate_every_spec(cfg, out: Path) -> None:
    """`namsa simulate` of ``cfg``: every planned sample is stored, and the only failures are the plan's."""
    planned = plan_samples(cfg.simulation)
    summary = data_runners.simulate(cfg, out, progress=False)
    assert summary.failed == planned.failures
    assert data_runners.stored_ids(out) == {spec.sample_id(cfg.simulation) for spec in planned.specs}


def test_a_named_material_without_a_zone_axis_is_a_plan_failure_and_every_planned_sample_is_stored(tmp_path):
    cfg = micro(f"simulation.materials=['{UNORIENTABLE}', Si-diamond]", "simulation.zone_axes=auto",
                "simulation.max_zone_axes=1")
    plan = plan_samples(cfg.simulation)
    [(material_id, why)] = plan.failures
    assert material_id == UNORIENTABLE and "found no usable zone axis" in why and "standard conventional cell" in why
    assert {s.material_id for s in plan.specs} == {"Si-diamond"} and plan.replaced == []   # named: not replaced
    simulate_every_spec(cfg, tmp_path / "data")


def test_an_explicit_axis_whose_cell_cannot_be_built_is_refused_at_plan_time(tmp_path):
    # rutile SnO2 along [0 1 1] needs 2.39% strain at an 8 A cell: orient_supercell would refuse it
    cfg = micro("simulation.materials=[SnO2-rutile, Si-diamond]")
    plan = plan_samples(cfg.simulation)
    [(material_id, why)] = plan.failures
    assert material_id == "SnO2-rutile" and "zone axis [0, 1, 1] of SnO2-rutile needs 2.39% strain" in why
    assert sorted((s.material_id, s.zone_axis) for s in plan.specs) == [
        ("Si-diamond", (0, 0, 1)), ("Si-diamond", (0, 1, 1)), ("SnO2-rutile", (0, 0, 1))]
    simulate_every_spec(cfg, tmp_path / "data")


def test_a_generated_material_without_a_zone_axis_is_replaced_by_the_next_draw(tmp_path):
    cfg = micro("simulation.materials=[]", "simulation.zone_axes=auto", "simulation.max_zone_axes=1",
                f"simulation.generator={json.dumps(GENERATOR)}")
    plain = generator.generated_ids(cfg.simulation.generator)
    plan = plan_samples(cfg.simulation)
    planned = list(dict.fromkeys(s.material_id for s in plan.specs))
    assert plan.replaced == ["A2B_aP6_2_2i_i:Y,Tm:1.8144"] == [m for m in plain if m not in planned]
    # the count holds, and every draw that was not refused is still drawn
    assert len(planned) == GENERATOR["count"] and planned[:2] == [m for m in plain if m not in plan.replaced]
    [(material_id, why)] = plan.failures
    assert material_id == plan.replaced[0] and "found no usable zone axis" in why and "next draw took its place" in why
    simulate_every_spec(cfg, tmp_path / "data")


def test_explicit_axes_a_generated_material_cannot_be_built_along_are_dropped_and_with_none_it_is_replaced():
    # rutile-type substitutions along [0 1 1] need > 2% strain at an 8 A cell, as SnO2 does
    gen = json.dumps({"count": 4, "seed": 2, "templates": ["TiO2-rutile", "Si-diamond"]})
    both = plan_samples(micro("simulation.materials=[]", f"simulation.generator={gen}").simulation)
    rutile = [m for m in both.sources if m.startswith("TiO2-rutile:")]
    assert rutile and not both.replaced   # planned along [0 0 1] alone: no structure type leaves the plan
    along_011 = sorted(s.material_id for s in both.specs if s.zone_axis == (0, 1, 1))
    assert along_011 == sorted(set(both.sources) - set(rutile))
    assert [m for m, _ in both.failures] == rutile
    assert all("zone axis [0, 1, 1]" in why and "% strain" in why for _, why in both.failures)
    only = plan_samples(micro("simulation.materials=[]", f"simulation.generator={gen}",
                              "simulation.zone_axes=[[0, 1, 1]]").simulation)
    assert only.replaced[0] == rutile[0] and all(m.startswith("TiO2-rutile:") for m in only.replaced)
    assert not any(m.startswith("TiO2-rutile:") for m in only.sources)
    assert [m for m, _ in only.failures] == only.replaced and len(only.sources) == len(only.specs) == 4


def test_a_rhombohedral_template_is_planned_along_its_hexagonal_axes():
    # Bi2Se3 on the AFLOW template, given in a primitive rhombohedral setting: its [0001] is [1, 1, -3]
    # there, index 3, which the search in its own cell (indices <= 2) never tried
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    material = "A2B3_hR10_167_c_e:Bi,Se:1.5521"
    plan = plan_samples(SimulationConfig(materials=[material], max_zone_axes=3))
    assert not plan.failures and [s.zone_axis for s in plan.specs] == [(1, 1, -3)]
    structure = generator.build(material)
    hexagonal = SpacegroupAnalyzer(structure, symprec=0.01).get_conventional_standard_structure().lattice
    cell = orient_supercell(structure, (1, 1, -3), 12.0, 30.0)
    # the beam repeats every hexagonal c, the in-plane cell is a x a sqrt(3), exact: the beam is [0001]
    assert cell.strain == 0.0 and abs(cell.repeat_A - hexagonal.c) < 1e-6
    assert np.allclose(sorted(cell.unit_A[:2]), [hexagonal.a, hexagonal.a * 3 ** 0.5])


def test_a_stored_plan_holds_the_refusals_and_is_read_back_whole(tmp_path, monkeypatch):
    cfg = micro("simulation.materials=[A2B3_hR10_167_c_e:Bi,Se:1.5521]", "simulation.zone_axes=auto",
                "simulation.max_zone_axes=1", f"simulation.generator={json.dumps(GENERATOR)}").simulation
    made, read_from = plan_cache.cached_plan(cfg, tmp_path)
    assert read_from is None and made == plan_samples(cfg)
    (path,) = tmp_path.glob("plan-*.json")
    stored = json.loads(path.read_text())
    assert stored["refused"] == made.replaced and len(stored["generated"]) == GENERATOR["count"]
    # the hexagonal axis lies beyond the index range a stored plan holds: searched again on a read
    assert "A2B3_hR10_167_c_e:Bi,Se:1.5521" not in stored["zone_axes"]

    def no_draw(*args, **kwargs):
        raise AssertionError("drawn again although a stored plan of the same key exists")

    monkeypatch.setattr(generator, "generated_ids", no_draw)
    again, read_from = plan_cache.cached_plan(cfg, tmp_path)
    assert again == made and read_from == path


def test_a_stored_refusal_the_plan_does_not_repeat_is_planned_over(tmp_path):
    cfg = micro("simulation.materials=[]", "simulation.zone_axes=auto", "simulation.max_zone_axes=1",
                f"simulation.generator={json.dumps(GENERATOR)}").simulation
    made, _ = plan_cache.cached_plan(cfg, tmp_path)
    (path,) = tmp_path.glob("plan-*.json")
    stored = json.loads(path.read_text())
    # signed with the user's key (so only the plan's own checks judge it): a material that plans, refused
    stored["refused"] = stored["refused"] + ["Cu-fcc:Ag:1.1000"]
    path.write_text(json.dumps(signed({k: v for k, v in stored.items() if k != MAC_FIELD}, plan_secret())))
    plan, read_from = plan_cache.cached_plan(cfg, tmp_path)
    assert plan == made and read_from is None
    assert json.loads(path.read_text())["refused"] == made.replaced   # stored again as the plan made it
