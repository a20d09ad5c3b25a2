"""Fuzz: model directories with mutated cards and invented safetensors headers.

Hypothesis (derandomized, bounded) mutates a real card's JSON tree (replace, delete or add a node
anywhere) and writes safetensors headers of random names, dtypes, shapes, offsets and header
lengths. The property: `models.load_reconstructor` succeeds (a mutation that left a valid
directory) or raises the project's one-line `UserError`, never another exception, and nothing
big is allocated on the way (the process's peak memory grows by less than 256 MB in total).
"""
from __future__ import annotations

import json
import resource
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import models
from models import checkpoint as ckpt
from models.card import CARD_FILE
from namsa.errors import UserError
from fuzzing import fuzz_settings
from test_hostile_model_dirs import make_run, record_weights

SETTINGS = fuzz_settings(60)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
    | st.text(max_size=12) | st.sampled_from(["potential", "density", "scan", "avg", "log1p", "../x"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("fuzz_base")) / "model"


def paths_of(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys / indices) into a JSON tree, the root included."""
    out = [prefix]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        out += paths_of(child, prefix + (key,))
    return out


def mutate(card: dict, path: tuple, action: str, value: Any, key: str) -> Any:
    """The card with the node at ``path`` replaced, deleted, or given a new child ``key``."""
    if not path:
        return value if action == "replace" else card
    parent = card
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "delete":
        parent.pop(last)
    elif action == "add" and isinstance(parent[last], dict):
        parent[last][key] = value
    else:
        parent[last] = value
    return card


def load_expecting_one_line(model_dir: Path) -> None:
    try:
        models.load_reconstructor(model_dir, device="cpu")
    except UserError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)


def fresh_copy(base: Path, tmp_path: Path) -> Path:
    target = tmp_path / "m"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(base, target)
    return target


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@SETTINGS
@given(data=st.data())
def test_mutated_cards(base, tmp_path, data):
    card = json.loads((base / CARD_FILE).read_text())
    path = data.draw(st.sampled_from(paths_of(card)))
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    new = mutate(card, path, action, data.draw(json_values), data.draw(st.text(max_size=8)))
    model_dir = fresh_copy(base, tmp_path)
    (model_dir / CARD_FILE).write_text(json.dumps(new))
    before = peak_mb()
    load_expecting_one_line(model_dir)
    assert peak_mb() - before < 256


def header_entries(names: list[str]) -> st.SearchStrategy[dict]:
    entry = st.fixed_dictionaries({
        "dtype": st.sampled_from(["F32", "F16", "I64", "U8", "BOGUS"]),
        "shape": st.lists(st.integers(0, 1 << 40) | st.sampled_from([1, 3, 8, 16]), max_size=4),
        "data_offsets": st.lists(st.integers(-1, 1 << 41) | st.sampled_from([0, 4, 64]), min_size=0, max_size=3)})
    return st.dictionaries(st.sampled_from(names) | st.text(max_size=10), entry | json_values, max_size=6)


@SETTINGS
@given(data=st.data())
def test_invented_safetensors_headers(base, tmp_path, data):
    from safetensors import safe_open

    with safe_open(str(base / ckpt.MODEL_FILE), framework="pt") as fh:
        names = list(fh.keys())
    header = data.draw(header_entries(names))
    text = json.dumps(header).encode()
    length = data.draw(st.sampled_from([len(text)]) | st.integers(0, 1 << 64 - 1))
    payload = data.draw(st.binary(max_size=512))
    model_dir = fresh_copy(base, tmp_path)
    (model_dir / ckpt.MODEL_FILE).write_bytes(struct.pack("<Q", length) + text + payload)
    if data.draw(st.booleans()):
        record_weights(model_dir)  # a forger re-records size and digest, so the header check decides
    before = peak_mb()
    load_expecting_one_line(model_dir)
    assert peak_mb() - before < 256
