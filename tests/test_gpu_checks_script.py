"""scripts/gpu_checks.sh fits one device call and forgets no gpu test file; bench_train's GPU
defaults (paper preset selectable, eager unless --compile). The rehearsal itself (install and
collection on a fresh Python 3.12 venv) is the slow-marked test at the end."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_checks.sh"
#: a time-limited line of the script: `step LOG NAME SECONDS ...`, `gpu_step LOG NAME SECONDS ...`
#: or `gpu_tests FILE SECONDS`
LIMITED = re.compile(r"^(?:step|gpu_step)\s+\S+\s+\S+\s+(\d+)\s|^gpu_tests\s+(\S+)\s+(\d+)\s*$", re.M)
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")


def _limited_lines() -> list[re.Match]:
    return list(LIMITED.finditer(SCRIPT.read_text()))


def test_step_limits_fit_one_device_call_under_nine_minutes():
    limits = [int(m.group(1) or m.group(3)) for m in _limited_lines()]
    assert len(limits) >= 8  # env, install, the test files, the benchmarks
    assert sum(limits) < 540, f"step limits sum to {sum(limits)} s"


def test_every_gpu_marked_test_file_is_run_by_file():
    marked = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").glob("test_*.py")
              if GPU_MARK.search(p.read_text())}
    listed = [m.group(2) for m in _limited_lines() if m.group(2)]
    assert len(listed) == len(set(listed))
    assert set(listed) == marked, (f"gpu-marked but not run: {sorted(marked - set(listed))}; "
                                   f"run but not gpu-marked: {sorted(set(listed) - marked)}")


def test_benchmarks_of_the_script_are_unbuffered_and_write_to_out():
    text = SCRIPT.read_text()
    bench = re.findall(r'"\$PY" (-u )?benchmarks/(\w+)\.py', text)
    assert {name for _, name in bench} >= {"bench_simulate", "bench_train"}
    assert all(flag for flag, _ in bench), "every benchmark runs with python -u"
    assert '--json "$OUT/bench_train.json"' in text and '--json "$OUT/bench_simulate.json"' in text


def test_bench_train_gpu_cases_are_eager_unless_asked_and_filter_presets():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_train
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    default = bench_train.gpu_cases(4)
    assert default and not any(c.compile for c in default)
    assert {c.preset for c in bench_train.gpu_cases(4, presets=("paper",))} == {"paper"}
    both = bench_train.gpu_cases(4, compile_too=True)
    assert sum(c.compile for c in both) == len(default) == len(both) // 2


def _python312() -> str | None:
    found = shutil.which("python3.12")
    pyenv = Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin" / "python3.12"
    return str(pyenv) if pyenv.exists() else found


@pytest.mark.slow
def test_rehearsal_installs_offline_and_collects_every_gpu_file(tmp_path):
    """Minutes and ~3 GB (torch for Python 3.12); needs .gpu-wheels (scripts/gpu_wheels.sh)."""
    py312 = _python312()
    if py312 is None or not (REPO / ".gpu-wheels" / "image-present.txt").exists():
        pytest.skip("needs python3.12 and .gpu-wheels (bash scripts/gpu_wheels.sh)")
    env = {**os.environ, "OUT": str(tmp_path), "NAMSA_GPU_REHEARSAL": "1", "PY312": py312,
           "NAMSA_REHEARSAL_VENV": str(tmp_path / "venv")}
    run = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1800)
    summary = (tmp_path / "summary.txt").read_text()
    assert run.returncode == 0, summary + (tmp_path / "gpu-tests.txt").read_text()[-3000:]
    assert summary.count("rc=0") == len(_limited_lines())  # every step ran (benchmarks: their --help)
