"""execution.plan_cache_dir (`workflow.plan_cache`): a plan's slow choices (generated materials, automatic
zone axes) are read instead of made again only while everything the plan is a function of is unchanged;
nothing else is stored, and it is signed with the user's key; a bad, foreign or unsigned file is planned
over, never trusted (hostile files and keys: tests/test_hostile_plan_cache.py); `namsa simulate` says
when it read one and simulates the same samples."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from namsa import SimulationConfig, generator, plan_samples, zone_axes
from workflow import plan_cache
from workflow.cli import main
from workflow.data_runners import stored_ids

MICRO = str(Path(__file__).resolve().parents[1] / "configs" / "micro.yaml")
# one library material, one generated one (drawn from the library's templates) and one that cannot be
# planned: the plan holds specs, sources and a failure
CFG = SimulationConfig(materials=["Si-diamond", "NaCl-rocksalt", "no-such-material"], generator={"count": 1},
                       max_zone_axes=2)


@pytest.fixture(autouse=True)
def plan_key_file(tmp_path_factory, monkeypatch):
    """A signing key of the test's own (workflow.plan_signature), not the user's ~/.cache one."""
    monkeypatch.setenv("NAMSA_PLAN_KEY", str(tmp_path_factory.mktemp("key") / "plan-cache.key"))


def unplannable(*args, **kwargs):
    raise AssertionError("drawn or searched again although a stored plan of the same key exists")


def test_a_stored_plan_is_read_back_whole_without_drawing_or_searching_again(tmp_path, monkeypatch):
    made, read_from = plan_cache.cached_plan(CFG, tmp_path)
    assert read_from is None and made == plan_samples(CFG)
    assert made.specs and made.failures and made.sources
    monkeypatch.setattr(generator, "generated_ids", unplannable)
    monkeypatch.setattr(zone_axes, "planned_zone_axes", unplannable)
    again, read_from = plan_cache.cached_plan(CFG, tmp_path)
    assert again == made and read_from.parent == tmp_path


def test_only_the_slow_choices_are_stored(tmp_path):
    # what follows from the config (sources, failures, variants, order) is planned from it on every read
    made, _ = plan_cache.cached_plan(CFG, tmp_path)
    (path,) = tmp_path.glob("plan-*.json")
    stored = json.loads(path.read_text())
    assert set(stored) == {"key", "generated", "zone_axes", "refused", "mac"}
    assert stored["refused"] == made.replaced == []   # the one generated material drawn plans
    generated = [m for m in made.sources if ":" in m]
    assert stored["generated"] == generated and len(generated) == CFG.generator.count
    assert stored["zone_axes"] == {m: [list(s.zone_axis) for s in made.specs if s.material_id == m]
                                   for m in dict.fromkeys(s.material_id for s in made.specs)}


def test_another_config_or_library_version_is_planned_afresh(tmp_path, monkeypatch):
    plan_cache.cached_plan(CFG, tmp_path)
    other = CFG.model_copy(update={"max_zone_axes": 1})
    planned, read_from = plan_cache.cached_plan(other, tmp_path)
    assert read_from is None and planned == plan_samples(other)
    key = plan_cache.plan_key(CFG)
    assert plan_cache.plan_key(other) != key
    real = plan_cache.library_version
    monkeypatch.setattr(plan_cache, "library_version", lambda name: "0.0" if name == "spglib" else real(name))
    assert plan_cache.plan_key(CFG) != key   # another spglib may answer symmetry questions otherwise


def test_a_changed_cif_changes_the_key(tmp_path):
    cifs = tmp_path / "cifs"
    cifs.mkdir()
    (cifs / "x.cif").write_text("data_x\n")
    cfg = SimulationConfig(materials=[], cif_dir=str(cifs))
    before = plan_cache.plan_key(cfg)
    (cifs / "x.cif").write_text("data_x\n_cell_length_a 4.0\n")
    assert plan_cache.plan_key(cfg) != before


@pytest.mark.parametrize("content", ["", "{not json", '{"key": "%s", "specs": [["Si", [0, 0]]]}', "[]"])
def test_an_unreadable_or_foreign_file_is_planned_over(tmp_path, content):
    _, _ = plan_cache.cached_plan(CFG, tmp_path)
    (path,) = tmp_path.glob("plan-*.json")
    path.write_text(content.replace("%s", plan_cache.plan_key(CFG)))
    planned, read_from = plan_cache.cached_plan(CFG, tmp_path)
    assert read_from is None and planned == plan_samples(CFG)
    assert json.loads(path.read_text())["key"] == plan_cache.plan_key(CFG)   # stored again, whole


def test_simulate_reads_the_stored_plan_and_simulates_the_same_samples(tmp_path, capsys):
    cache = tmp_path / "plans"
    args = ["--no-progress", "--set", f"execution.plan_cache_dir={cache}"]
    assert main(["simulate", MICRO, "--out", str(tmp_path / "a"), *args]) == 0
    assert "read from" not in capsys.readouterr().err and len(list(cache.glob("plan-*.json"))) == 1
    assert main(["simulate", MICRO, "--out", str(tmp_path / "b"), *args]) == 0
    assert "the plan (8 samples) read from" in capsys.readouterr().err
    assert stored_ids(tmp_path / "a") == stored_ids(tmp_path / "b") and len(stored_ids(tmp_path / "a")) == 8


def test_the_machines_fields_plan_nothing():
    # the GPU study's CPU fallback simulates the same plan with device=cpu and one thread per worker
    cpu = CFG.model_copy(update={"device": "cuda", "host_threads": 4, "memory_budget_gb": 40.0})
    assert plan_cache.plan_key(cpu) == plan_cache.plan_key(CFG)


def test_a_later_calls_fresh_variants_read_the_stored_plan(tmp_path, monkeypatch):
    """scripts/gpu_study.sh plans fresh variants (first_variant) of the plan stored on the build machine."""
    varied = CFG.model_copy(update={"variations": CFG.variations.model_copy(update={"thickness_range_A": (10.0, 40.0)})})
    made, _ = plan_cache.cached_plan(varied, tmp_path)
    fresh = varied.model_copy(update={"first_variant": 3, "variants": 2})
    assert plan_cache.plan_key(fresh) == plan_cache.plan_key(varied)
    planned = plan_samples(fresh)
    monkeypatch.setattr(generator, "generated_ids", unplannable)
    monkeypatch.setattr(zone_axes, "planned_zone_axes", unplannable)
    again, read_from = plan_cache.cached_plan(fresh, tmp_path)
    assert read_from is not None and again == planned
    assert {s.variant for s in again.specs} == {3, 4}
    assert [(s.material_id, s.zone_axis) for s in again.specs[::2]] == [(s.material_id, s.zone_axis)
                                                                      for s in made.specs]


def test_a_cache_dir_that_cannot_hold_the_plan_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the plans should go\n")
    assert main(["simulate", MICRO, "--out", str(tmp_path / "d"), "--no-progress",
                 "--set", f"execution.plan_cache_dir={blocker}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "execution.plan_cache_dir=" in err[0] and "writable folder" in err[0], err
    assert not (tmp_path / "d").exists()   # nothing simulated, nothing written
