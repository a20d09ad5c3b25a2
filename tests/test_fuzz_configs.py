"""Fuzz: malformed YAML configs (mutations of configs/micro.yaml) fed to `namsa simulate`.

Hypothesis mutates micro.yaml: a value replaced by another type, a huge, negative or NaN number,
a key removed or added, a deeply nested value, or the whole file replaced by bytes that are not
UTF-8. Every run adds ``--set simulation.materials=[]``, ``cif_dir=null`` and ``generator.count=0``
so that a config that validates stops at "nothing to simulate" before any simulation work.
The property: exit 2 with exactly one ``namsa: error:`` line (or exit 0), never a traceback,
never a file written outside ``--out``.

The second test (issue 32, C) writes hostile YAML text rather than mutated values: alias bombs,
aliases inside their own anchor, repeated keys, deep nesting, huge scalars and seeds, random
bytes, in the file and in ``--set`` values; its hypothesis ``deadline`` bounds the time of each.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import yaml
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings

from workflow.cli import main

REPO = Path(__file__).resolve().parents[1]
MICRO = yaml.safe_load((REPO / "configs" / "micro.yaml").read_text())
STOP_EARLY = ["--set", "simulation.materials=[]", "--set", "simulation.cif_dir=null",
              "--set", "simulation.generator.count=0"]

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
                    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e-308, 0.0]),
                    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3))


def _paths(node, prefix=()):
    """Every key path of a nested mapping."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


@st.composite
def mutated_config(draw) -> bytes:
    """micro.yaml with a few mutations, as the bytes of a config file."""
    if draw(st.integers(0, 9)) == 0:   # not a text file at all
        return draw(st.binary(min_size=1, max_size=64)) + b"\xff\xfe"
    cfg = copy.deepcopy(MICRO)
    paths = list(_paths(cfg))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent = cfg
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        action = draw(st.sampled_from(["replace", "delete", "extra", "nest"]))
        if action == "replace":
            parent[path[-1]] = draw(SCALARS)
        elif action == "delete":
            parent.pop(path[-1], None)
        elif action == "extra":
            parent[draw(st.text(min_size=1, max_size=8))] = draw(SCALARS)
        else:
            parent[path[-1]] = _nested(draw(st.integers(1, 60)))
    return yaml.safe_dump(cfg, allow_unicode=True).encode()


@fuzz_settings(60)
@given(content=mutated_config())
def test_a_malformed_config_is_one_line_or_runs(content, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("fuzz")
    config = root / "config.yaml"
    config.write_bytes(content)
    out = root / "out"
    try:
        rc = main(["simulate", str(config), "--out", str(out), "--no-progress", *STOP_EARLY])
    except SystemExit as exc:   # argparse
        rc = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert "Traceback" not in captured.err
    assert rc in (0, 2), (rc, captured.err[-2000:])
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("namsa: error: "), captured.err[-2000:]
    assert sorted(p.name for p in root.iterdir()) in (["config.yaml"], ["config.yaml", "out"])


SEED_KEYS = ["simulation.seed", "simulation.generator.seed", "data.split_seed", "data.dose_augmentation.seed",
             "data.symmetry_augmentation.seed", "training.seed", "evaluation.seed"]


@st.composite
def alias_bomb(draw) -> str:
    """``levels`` anchors of ``width`` aliases each: width**levels values in a few hundred bytes."""
    levels, width = draw(st.integers(2, 12)), draw(st.integers(2, 12))
    items = [f"&a0 [{', '.join(['x'] * width)}]"]
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


@st.composite
def deep(draw) -> str:
    depth = draw(st.integers(1, 400))
    opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
    return opener * depth + "1" + closer * depth


HOSTILE_VALUES = st.one_of(
    alias_bomb(), deep(),
    st.sampled_from(["&m [Si, *m]", "&m {a: *m}", "[1, *undefined]", "{a: 1, a: 2}", "2024-13-45", "!!python/object:os.system {}"]),
    st.integers(min_value=-10**40, max_value=10**40).map(str),
    st.integers(1000, 6000).map(lambda n: "9" * n),
    st.integers(1, 300_000).map(lambda n: "'" + "x" * n + "'"))


@st.composite
def hostile_config(draw) -> tuple[bytes, list[str]]:
    """A config file's bytes and extra ``--set`` arguments, one or the other hostile."""
    kind = draw(st.sampled_from(["file-value", "set-value", "duplicate", "seed", "bytes"]))
    micro = yaml.safe_dump(MICRO)
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=2048)), []
    if kind == "duplicate":
        section = draw(st.sampled_from(sorted(MICRO)))
        return (micro + yaml.safe_dump({section: MICRO[section]})).encode(), []
    if kind == "seed":
        value = draw(st.one_of(st.integers(min_value=-10**30, max_value=10**30), st.sampled_from([2**63, 2**64, -1])))
        return micro.encode(), ["--set", f"{draw(st.sampled_from(SEED_KEYS))}={value}"]
    value = draw(HOSTILE_VALUES)
    key = draw(st.sampled_from(["name", "simulation.materials", "evaluation.multislice_ptycho", "training.seed"]))
    if kind == "set-value":
        return micro.encode(), ["--set", f"{key}={value}"]
    section, _, leaf = key.rpartition(".")
    others = yaml.safe_dump({k: v for k, v in MICRO.items() if k != (section or key)})
    text = f"{section}:\n  {leaf}: {value}\n" if section else f"{key}: {value}\n"
    return (others + text).encode(), []


@fuzz_settings(40, deadline=timedelta(seconds=20))
@given(hostile=hostile_config())
def test_hostile_yaml_is_one_line_in_bounded_time(hostile, tmp_path_factory, capsys):
    content, extra = hostile
    root = tmp_path_factory.mktemp("hostile")
    config = root / "config.yaml"
    config.write_bytes(content)
    try:
        rc = main(["simulate", str(config), "--out", str(root / "out"), "--no-progress", *STOP_EARLY, *extra])
    except SystemExit as exc:   # argparse
        rc = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert "Traceback" not in captured.err
    assert rc in (0, 2), (rc, captured.err[-2000:])
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("namsa: error: "), captured.err[-2000:]
