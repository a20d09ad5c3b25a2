"""namsa.fftplans: FFTW plans measured once per machine, shared through a wisdom file, identical in
every process (the guarantee behind bit-identical samples, tests/test_simulate.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("pyfftw")

#: plans one (3, 24, 20) pair in a fresh interpreter, transforms a fixed input, prints what happened
PLAN_IN_A_FRESH_PROCESS = """
import hashlib, json, sys
import numpy as np, pyfftw
from namsa.fftplans import plan_pair, wisdom_path
buf = pyfftw.empty_aligned((3, 24, 20), dtype=np.complex64)
fwd, bwd, measured = plan_pair(buf, sys.argv[1])
buf[...] = np.random.default_rng(0).standard_normal(buf.shape) + 1j
fwd.execute()
print(json.dumps({"measured": measured, "digest": hashlib.sha256(buf.tobytes()).hexdigest(),
                  "wisdom": str(wisdom_path())}))
"""


def _fresh(effort: str, cache: os.PathLike) -> dict:
    env = dict(os.environ, NAMSA_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", PLAN_IN_A_FRESH_PROCESS, effort], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_process_measures_and_saves_the_others_import_the_same_plan(tmp_path):
    first, second = _fresh("measure", tmp_path), _fresh("measure", tmp_path)
    assert first["measured"] and not second["measured"]   # the second planned from the wisdom file only
    assert first["digest"] == second["digest"]
    record = json.loads(open(first["wisdom"]).read())
    assert ["complex64", 3, 24, 20] in record["shapes"] and "fftwf_wisdom" in record["wisdom"][1]
    assert os.path.dirname(first["wisdom"]) == str(tmp_path)


def test_plans_transform_correctly_and_estimate_needs_no_wisdom(tmp_path, monkeypatch):
    import pyfftw

    from namsa.fftplans import plan_pair, wisdom_path

    monkeypatch.setenv("NAMSA_CACHE_DIR", str(tmp_path / "empty"))
    buf = pyfftw.empty_aligned((2, 16, 12), dtype=np.complex64)
    fwd, bwd, measured = plan_pair(buf, "estimate")
    assert not measured and not wisdom_path().exists()
    a = (np.random.default_rng(1).standard_normal(buf.shape) + 0.5j).astype(np.complex64)
    buf[...] = a
    fwd.execute()
    np.testing.assert_allclose(buf, np.fft.fft2(a), rtol=1e-4, atol=1e-4)
    bwd.execute()
    np.testing.assert_allclose(buf / (16 * 12), a, rtol=1e-4, atol=1e-5)   # unnormalised pair
    with pytest.raises(ValueError, match="planner effort"):
        plan_pair(buf, "exhaustive-ish")


def test_an_unwritable_cache_warns_and_still_plans(tmp_path, monkeypatch):
    import pyfftw

    from namsa import fftplans

    # Start from no wisdom in this process: a shape measured earlier in the session (by any test)
    # would be planned from memory and never touch the cache. Other tests re-import their files.
    pyfftw.forget_wisdom()
    monkeypatch.setattr(fftplans, "_imported", set())
    plan_pair = fftplans.plan_pair
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NAMSA_CACHE_DIR", str(blocker / "cache"))
    buf = pyfftw.empty_aligned((1, 10, 14), dtype=np.complex64)   # a shape no other test plans
    with pytest.warns(RuntimeWarning, match="NAMSA_CACHE_DIR"):
        fwd, _, measured = plan_pair(buf, "measure")
    assert measured
    buf[...] = 1.0
    fwd.execute()
    assert buf[0, 0, 0] == pytest.approx(140.0)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    from namsa.fftplans import cache_dir, machine_key

    monkeypatch.setenv("NAMSA_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("NAMSA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "namsa"
    assert machine_key() == machine_key() and len(machine_key()) == 16


def test_unknown_fft_choice_is_a_user_error():
    from namsa import UserError
    from namsa.backend import get_backend

    with pytest.raises(UserError, match="fft must be"):
        get_backend("cpu", "fftw")
