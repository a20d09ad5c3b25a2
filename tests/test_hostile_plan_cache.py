"""Hostile plan files in execution.plan_cache_dir (issue 39, item 2; `workflow.plan_cache`).

The plan's key is a public function of config and code, so anyone who can write a shared cache folder
can put a file there that the next `namsa simulate` finds. Before, such a file decided the plan: its
``sources`` read a CIF from anywhere on the machine and stored that structure under the config's ids,
or simulated every material as gold; its specs added materials or variants (other seeds); a FIFO at
its name hung every simulate, deep nesting was a RecursionError traceback. Now only a regular file
under a size cap is read, only when the user's own key signed it (`workflow.plan_signature`), only
the slow choices (generated ids, automatic zone axes) are taken from it and each is checked against
the config (these cases are signed with the user's key, so the checks are shown to hold by
themselves); anything else is planned over and stored again. Every case ends with exit 0 and the plan
the config makes (`plan_samples`). The signature closes what no check can: another valid choice
(gold substituted in a recipe, another low-index axis), and a key file that cannot be trusted is
refused in one warning line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymatgen.io.cif import CifWriter

import stage
from fuzzing import fuzz_settings
from namsa import SimulationConfig, generator, library, plan_samples, zone_axes
from namsa.material_id import generated_id, split_generated_id
from test_plan_cache import unplannable
from workflow import plan_cache
from workflow.cli import main
from workflow.config import load_config
from workflow.data_runners import stored_ids
from workflow.plan_signature import KEY_ENV, MAC_FIELD, plan_secret, signed

MICRO = str(Path(__file__).resolve().parents[1] / "configs" / "micro.yaml")
# two materials on one explicit axis: two samples, a second or two per simulate
SMALL = ["--set", "simulation.materials=[Si-diamond, Cu-fcc]", "--set", "simulation.zone_axes=[[0, 0, 1]]"]
FORMULAS = {"Si-diamond": "Si", "Cu-fcc": "Cu"}
# automatic zone axes and one generated material: the choices a stored plan holds (tests/test_plan_cache.py)
AUTO = SimulationConfig(materials=["Si-diamond", "NaCl-rocksalt", "no-such-material"], generator={"count": 1},
                        max_zone_axes=2)


@pytest.fixture(scope="module", autouse=True)
def plan_key_file(tmp_path_factory):
    """The module's signing key (this user's, as far as the cache can tell), not ~/.cache's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, str(tmp_path_factory.mktemp("key") / "plan-cache.key"))
        yield


def small_config() -> SimulationConfig:
    return load_config(MICRO, SMALL[1::2]).simulation


def plan_file(cfg: SimulationConfig, cache: Path) -> Path:
    """Where this user's plan of ``cfg`` is kept in ``cache``."""
    return plan_cache.plan_path(plan_cache.plan_key(cfg), cache, plan_secret())


def store(cfg: SimulationConfig, cache: Path) -> tuple[Path, dict]:
    """The plan file `cached_plan` stores for ``cfg`` in ``cache``, and its JSON."""
    plan_cache.cached_plan(cfg, cache)
    path = plan_file(cfg, cache)
    return path, json.loads(path.read_text())


def write_signed(path: Path, payload: dict) -> None:
    """``payload`` (its old signature dropped) signed with this user's key: only the checks judge it."""
    path.write_text(json.dumps(signed({k: v for k, v in payload.items() if k != MAC_FIELD}, plan_secret())))


def old_form(cfg: SimulationConfig, key: str, **edits) -> dict:
    """The plan file as it was before issue 39 (specs, failures, sources), with ``edits``."""
    plan = plan_samples(cfg)
    return {"key": key, "specs": [[s.material_id, list(s.zone_axis), s.variant] for s in plan.specs],
            "failures": [list(f) for f in plan.failures], "sources": dict(plan.sources), **edits}


def gold_cif(folder: Path) -> Path:
    path = folder / "outside" / "gold.cif"
    path.parent.mkdir(parents=True)
    CifWriter(library.get("Au-fcc")).write_file(str(path))
    return path


def simulate_over(tmp_path: Path, cache: Path) -> Path:
    """`namsa simulate` of the small config with ``cache``; asserts exit 0 and returns --out."""
    out = tmp_path / "out"
    assert main(["simulate", MICRO, "--out", str(out), "--no-progress", "--set",
                 f"execution.plan_cache_dir={cache}", *SMALL]) == 0
    return out


def assert_the_configs_plan(cfg: SimulationConfig, cache: Path, out: Path) -> None:
    """``out`` holds exactly the config's samples, of the config's structures, and the plan file now
    holds the config's own plan (read back as a regular file)."""
    fresh = plan_samples(cfg)
    assert stored_ids(out) == {spec.sample_id(cfg) for spec in fresh.specs}
    formulas = {}
    for path in stage.find_stores(out):
        with stage.open_store(path) as reader:
            formulas.update((reader.meta(i).material_id, reader.meta(i).formula) for i in range(len(reader)))
    assert formulas == FORMULAS
    assert_planned_over(cfg, cache)


def assert_planned_over(cfg: SimulationConfig, cache: Path) -> None:
    path = plan_file(cfg, cache)
    assert path.is_file() and not path.is_symlink()
    plan, read_from = plan_cache.cached_plan(cfg, cache)
    assert plan == plan_samples(cfg) and read_from == path


# --- the attacks of the issue, through `namsa simulate` -------------------------------------------------

def hostile_payloads(cfg: SimulationConfig, key: str, outside: Path) -> dict[str, dict]:
    everything = [[m, [0, 0, 1], 0] for m in FORMULAS]
    return {
        "outside-cif-in-sources": old_form(cfg, key, sources={m: str(outside) for m in FORMULAS}),
        "outside-cif-beside-the-choices": {"key": key, "generated": [], "zone_axes": {},
                                           "sources": {m: str(outside) for m in FORMULAS}},
        "every-material-gold": old_form(cfg, key, sources={m: "Au-fcc" for m in FORMULAS}),
        "gold-as-a-generated-material": {"key": key, "generated": ["Au-fcc"], "zone_axes": {}},
        "extra-material": old_form(cfg, key, specs=everything + [["Au-fcc", [0, 0, 1], 0]],
                                   sources={**{m: m for m in FORMULAS}, "Au-fcc": "Au-fcc"}),
        "extra-material-with-axes": {"key": key, "generated": [], "zone_axes": {"Au-fcc": [[0, 0, 1]]}},
        "other-variants-and-seeds": old_form(cfg, key, specs=[[m, a, v] for m, a, _ in everything for v in (0, 3, 7)],
                                             seed=12345),
        "variants-beside-the-choices": {"key": key, "generated": [], "zone_axes": {}, "variants": 5, "seed": 1},
        "bad-axes-in-specs": old_form(cfg, key, specs=[[m, [0, 0, 0], 0] for m in FORMULAS]),
        "bad-axes": {"key": key, "generated": [], "zone_axes": {"Si-diamond": [[0, 0, 0]], "Cu-fcc": [["x", 1, 1]]}},
    }


CASES = ["outside-cif-in-sources", "outside-cif-beside-the-choices", "every-material-gold",
         "gold-as-a-generated-material", "extra-material", "extra-material-with-axes", "other-variants-and-seeds",
         "variants-beside-the-choices", "bad-axes-in-specs", "bad-axes"]


@pytest.mark.parametrize("case", CASES)
def test_an_edited_plan_decides_nothing(tmp_path, case):
    cfg, cache = small_config(), tmp_path / "plans"
    path, _ = store(cfg, cache)
    outside = gold_cif(tmp_path)
    write_signed(path, hostile_payloads(cfg, plan_cache.plan_key(cfg), outside)[case])
    assert_the_configs_plan(cfg, cache, simulate_over(tmp_path, cache))


@pytest.mark.timeout(120)
def test_a_fifo_at_the_plans_name_is_planned_over_not_waited_on(tmp_path):
    cfg, cache = small_config(), tmp_path / "plans"
    path, _ = store(cfg, cache)
    path.unlink()
    os.mkfifo(path)
    assert_the_configs_plan(cfg, cache, simulate_over(tmp_path, cache))


def test_100000_nested_lists_are_planned_over(tmp_path, capsys):
    cfg, cache = small_config(), tmp_path / "plans"
    path, _ = store(cfg, cache)
    nested = "[" * 100_000 + "]" * 100_000
    key = plan_cache.plan_key(cfg)
    path.write_text(f'{{"key": "{key}", "generated": [], "zone_axes": {{"Si-diamond": {nested}}}}}')
    assert_the_configs_plan(cfg, cache, simulate_over(tmp_path, cache))
    assert "Traceback" not in capsys.readouterr().err


def test_an_oversized_plan_is_not_read(tmp_path):
    cfg, cache = small_config(), tmp_path / "plans"
    path, payload = store(cfg, cache)
    text = json.dumps(payload)   # a valid plan of the key, padded past the cap: refused by its size alone
    path.write_text(text + " " * (plan_cache.MAX_PLAN_BYTES + 1 - len(text)))
    assert_the_configs_plan(cfg, cache, simulate_over(tmp_path, cache))
    assert path.stat().st_size < 1000


def test_a_link_at_the_plans_name_is_not_followed(tmp_path):
    cfg, cache = small_config(), tmp_path / "plans"
    path, _ = store(cfg, cache)
    target, outside = tmp_path / "elsewhere.json", gold_cif(tmp_path)
    hostile = json.dumps(old_form(cfg, plan_cache.plan_key(cfg), sources={m: str(outside) for m in FORMULAS}))
    target.write_text(hostile)
    path.unlink()
    path.symlink_to(target)
    assert_the_configs_plan(cfg, cache, simulate_over(tmp_path, cache))
    assert target.read_text() == hostile   # replaced, not written through


# --- the choices a plan of automatic zone axes holds, checked one by one --------------------------------

BAD_AXES = {"zero": [[0, 0, 0]], "two-indices": [[1, 2]], "a-string-index": [["1", 0, 0]],
            "a-bool-index": [[True, 0, 1]], "a-float-index": [[1.0, 0, 0]], "negative-first-index": [[0, 0, -1]],
            "not-divided-by-gcd": [[0, 0, 2]], "beyond-the-search": [[3, 0, 1]], "huge": [[10 ** 30, 0, 1]],
            "repeated": [[0, 0, 1], [0, 0, 1]], "more-than-max-zone-axes": [[0, 0, 1], [0, 1, 1], [1, 1, 1]],
            "none": [], "a-string": "001", "a-mapping": {"u": 0, "v": 0, "w": 1}}
BAD_GENERATED = {"a-library-id": ["Au-fcc"], "too-many": ["Cu-fcc:Au:1.0000", "Cu-fcc:Ag:1.0000"], "none": [],
                 "another-spelling": ["BN-hexagonal:Rh,Cs:2.5"], "scale-out-of-range": ["BN-hexagonal:Rh,Cs:9.0000"],
                 "element-outside-the-pool": ["BN-hexagonal:Rh,Xx:2.5000"], "unknown-template": ["NOPE:Au:1.0000"],
                 "a-source-the-config-does-not-use": ["AB_cF8_225_a_b:Sr,S:1.2699"], "a-path": ["/etc/passwd"],
                 "not-a-string": [7]}


def assert_auto_planned_over(cache: Path, edit) -> None:
    path, payload = store(AUTO, cache)
    edit(payload)
    write_signed(path, payload)
    plan, read_from = plan_cache.cached_plan(AUTO, cache)
    assert plan == plan_samples(AUTO) and read_from is None
    assert_planned_over(AUTO, cache)


@pytest.mark.parametrize("axes", BAD_AXES.values(), ids=BAD_AXES.keys())
def test_bad_stored_axes_are_planned_over(tmp_path, axes):
    assert_auto_planned_over(tmp_path, lambda payload: payload["zone_axes"].update({"Si-diamond": axes}))


@pytest.mark.parametrize("ids", BAD_GENERATED.values(), ids=BAD_GENERATED.keys())
def test_generated_ids_the_generator_cannot_draw_are_planned_over(tmp_path, ids):
    assert_auto_planned_over(tmp_path, lambda payload: payload.update(generated=ids))


def test_axes_of_a_material_the_config_does_not_plan_are_never_used(tmp_path):
    assert_auto_planned_over(tmp_path, lambda payload: payload["zone_axes"].update({"Au-fcc": [[0, 0, 1]]}))


def test_a_material_left_out_is_searched_not_dropped(tmp_path):
    assert_auto_planned_over(tmp_path, lambda payload: payload["zone_axes"].pop("Si-diamond"))


# --- fuzz: a real stored plan's JSON tree, mutated ----------------------------------------------------

# small integers often make another valid axis, the one choice a file still makes
JSON_SCALARS = st.none() | st.booleans() | st.integers(-10, 10) | st.integers() | st.floats(allow_nan=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)


def _nodes(tree, path=()):
    """The path of every node of a JSON tree (the root is ())."""
    yield path
    children = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, child in children:
        yield from _nodes(child, path + (key,))


def _mutate(tree, path, action: str, value):
    if not path:
        return value
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    elif action == "insert" and isinstance(parent, list):
        parent.insert(path[-1], value)
    elif action == "insert":
        parent[f"{path[-1]}-extra"] = value
    else:
        parent[path[-1]] = value
    return tree


@pytest.fixture(scope="module")
def auto_plan(tmp_path_factory):
    """(the plan of AUTO, the JSON of its stored file)."""
    return plan_samples(AUTO), store(AUTO, tmp_path_factory.mktemp("stored"))[1]


@fuzz_settings(40)
@given(data=st.data())
def test_fuzz_a_mutated_plan_decides_no_material_source_or_variant(auto_plan, tmp_path_factory, data):
    fresh, stored = auto_plan
    tree = json.loads(json.dumps(stored))
    path = data.draw(st.sampled_from(list(_nodes(tree))), label="path")
    action = data.draw(st.sampled_from(["replace", "delete", "insert"]), label="action")
    tree = _mutate(tree, path, action, data.draw(JSON_VALUES, label="value"))
    # re-signed: what the user's own key signed is judged by the checks alone
    resigned = isinstance(tree, dict) and data.draw(st.booleans(), label="re-signed")
    target = plan_file(AUTO, tmp_path_factory.mktemp("fuzz"))
    try:
        if resigned:
            write_signed(target, tree)
    except ValueError:   # an infinite float: JSON cannot spell it, so no key signs it
        resigned = False
    if not resigned:
        target.write_text(json.dumps(tree))
    cache = target.parent
    plan, read_from = plan_cache.cached_plan(AUTO, cache)
    # what follows from the config is the config's whatever the file says ...
    assert plan.sources == fresh.sources and plan.failures == fresh.failures
    assert {(s.material_id, s.variant) for s in plan.specs} == {(s.material_id, s.variant) for s in fresh.specs}
    # ... a file not exactly as signed is planned over; a valid one the key signed (another axis the
    # search could return) is the one choice a file still makes
    if read_from is None:
        assert plan == fresh
    else:
        assert resigned or tree == stored
        assert all(spec.zone_axis in plan_cache.SEARCH_AXES for spec in plan.specs)
    again, _ = plan_cache.cached_plan(AUTO, cache)
    assert again == plan


# --- the signature: another valid choice, and the key file ------------------------------------------

def another_valid_choice(payload: dict, choice: str) -> dict:
    """``payload`` with one choice swapped for another that every check accepts (its signature kept)."""
    edited = json.loads(json.dumps(payload))
    if choice == "gold-substituted":   # the generated recipe with gold on its first site
        (drawn,) = edited["generated"]
        template, elements, scale = split_generated_id(drawn)
        edited["generated"] = [generated_id(template, ["Au", *elements[1:]], float(scale))]
        edited["zone_axes"][edited["generated"][0]] = edited["zone_axes"].pop(drawn)
    else:   # another low-index axis the search could return
        axes = edited["zone_axes"]["Si-diamond"]
        axes[0] = list(next(a for a in sorted(plan_cache.SEARCH_AXES) if list(a) not in axes))
    assert edited["generated"] != payload["generated"] or edited["zone_axes"] != payload["zone_axes"]
    return edited


@pytest.mark.parametrize("mac", ["the-old-one", "none", "another-users"])
@pytest.mark.parametrize("choice", ["gold-substituted", "another-axis"])
def test_another_valid_choice_without_this_users_signature_is_planned_over(tmp_path, monkeypatch, choice, mac):
    path, payload = store(AUTO, tmp_path / "plans")
    edited = another_valid_choice(payload, choice)
    if mac == "none":
        del edited[MAC_FIELD]
    elif mac == "another-users":
        monkeypatch.setenv(KEY_ENV, str(tmp_path / "another-user.key"))
        edited = signed({k: v for k, v in edited.items() if k != MAC_FIELD}, plan_secret())
        monkeypatch.undo()
    path.write_text(json.dumps(edited))
    plan, read_from = plan_cache.cached_plan(AUTO, tmp_path / "plans")
    assert plan == plan_samples(AUTO) and read_from is None
    assert_planned_over(AUTO, tmp_path / "plans")


@pytest.mark.parametrize("choice", ["gold-substituted", "another-axis"])
def test_a_signed_plan_is_read_without_planning_and_the_key_decides(tmp_path, monkeypatch, choice):
    # the same choices signed with the user's key are believed: the signature, not the checks, refused them above
    path, payload = store(AUTO, tmp_path)
    write_signed(path, another_valid_choice(payload, choice))
    fresh = plan_samples(AUTO)
    monkeypatch.setattr(generator, "generated_ids", unplannable)
    monkeypatch.setattr(zone_axes, "planned_zone_axes", unplannable)
    plan, read_from = plan_cache.cached_plan(AUTO, tmp_path)
    assert read_from == path and plan != fresh and len(plan.specs) == len(fresh.specs)


def test_the_key_file_is_the_one_named_and_another_key_does_not_accept_its_plans(tmp_path, monkeypatch):
    cache, alice, bob = tmp_path / "plans", tmp_path / "alice" / "plan-cache.key", tmp_path / "bob" / "plan-cache.key"
    monkeypatch.setenv(KEY_ENV, str(alice))
    alices_plan, _ = store(AUTO, cache)
    assert alice.stat().st_size == 32 and alice.stat().st_mode & 0o777 == 0o600
    assert alice.parent.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv(KEY_ENV, str(bob))
    bobs_plan = plan_file(AUTO, cache)
    assert bobs_plan != alices_plan and not bobs_plan.exists()   # side by side in a shared folder
    bobs_plan.write_text(alices_plan.read_text())   # alice's signed plan where bob reads his
    plan, read_from = plan_cache.cached_plan(AUTO, cache)
    assert plan == plan_samples(AUTO) and read_from is None
    assert plan_cache.cached_plan(AUTO, cache)[1] == bobs_plan   # stored again, signed with bob's key
    monkeypatch.setenv(KEY_ENV, str(alice))
    assert plan_cache.cached_plan(AUTO, cache)[1] == alices_plan


def refused_key(folder: Path, kind: str) -> Path:
    """A key file of ``kind`` that is not to be trusted (a link's target is a good key)."""
    key, real = folder / "plan-cache.key", folder / "real.key"
    real.write_bytes(os.urandom(16 if kind == "short" else 32))
    real.chmod(0o640 if kind == "group-readable" else 0o600)
    if kind == "not-yours":
        os.chown(real, os.geteuid() + 1, -1)
    if kind == "symlink":
        key.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(key, 0o600)
    else:
        real.rename(key)
    return key


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["symlink", "group-readable", "fifo", "short", pytest.param(
    "not-yours", marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away"))])
def test_a_key_file_that_cannot_be_trusted_is_refused_in_one_line_and_planning_goes_on(tmp_path, monkeypatch,
                                                                                        capsys, kind):
    key = refused_key(tmp_path, kind)
    monkeypatch.setenv(KEY_ENV, str(key))
    cfg, cache = small_config(), tmp_path / "plans"
    plan, read_from = plan_cache.cached_plan(cfg, cache)
    assert plan == plan_samples(cfg) and read_from is None
    assert not cache.exists()   # nothing stored without a key to sign it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0] and str(key) in err[0] and KEY_ENV in err[0], err
    assert "made afresh and not stored" in err[0]
