"""scripts/gpu_checks.sh fits one device call and forgets no gpu test file; both device scripts take
each step's limit from their table of measured seconds (scripts/gpu_common.sh's margin rule), and a step
that fails or runs out of its limit is said in summary.txt while the next one runs; bench_train's GPU
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
#: a time-limited line of a device script: `step LOG NAME ...`, `gpu_step LOG NAME ...` or `gpu_tests FILE`;
#: the step's NAME is its row in the script's LIMITS table
#: (the helpers' own calls, which pass on a variable's NAME, are not steps)
LIMITED = re.compile(r"^[ \t]*(?:step|gpu_step)[ \t]+\S+[ \t]+([^\s\"$]\S*)[ \t]|^gpu_tests[ \t]+(\S+)[ \t]*$", re.M)
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")
#: a row of `NAMSA_GPU_LIMITS_ONLY=1 bash SCRIPT`: NAME, its limit, the table's KIND and SECONDS
PRINTED_ROW = re.compile(r"^   (\S+)\s+(\d+) s  \((measured|bound|unmeasured) (\d+)\)$", re.M)
PRINTED_SUM = re.compile(r"^step limits sum to (\d+) s of the (\d+) s a device command has", re.M)


def device_limits(script: Path) -> tuple[dict[str, tuple[int, str, int]], int, int]:
    """What ``script`` prints of its step limits without running a step: NAME -> (limit, KIND, SECONDS)
    in table order, their sum and the command's budget (seconds on the device)."""
    done = subprocess.run(["bash", str(script)], env={**os.environ, "NAMSA_GPU_LIMITS_ONLY": "1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {m.group(1): (int(m.group(2)), m.group(3), int(m.group(4))) for m in PRINTED_ROW.finditer(done.stdout)}
    (total, budget), = [(int(a), int(b)) for a, b in PRINTED_SUM.findall(done.stdout)]
    return rows, total, budget


def step_names(script: Path) -> list[str]:
    """The NAME of each time-limited line of ``script``, in the order they run."""
    return [m.group(1) or m.group(2) for m in LIMITED.finditer(script.read_text())]


def _limited_lines() -> list[re.Match]:
    return list(LIMITED.finditer(SCRIPT.read_text()))


@pytest.mark.parametrize("name", ["gpu_checks.sh", "gpu_study.sh"])
def test_each_steps_limit_is_its_table_row_by_the_margin_rule_and_they_fit_one_device_command(name):
    script = REPO / "scripts" / name
    rows, total, budget = device_limits(script)
    # every step has its row, in the order the steps run; every row is a step
    assert step_names(script) == list(rows), (step_names(script), list(rows))
    assert total == sum(limit for limit, _, _ in rows.values()) and total <= budget == 570, (total, budget)
    for step, (limit, kind, seconds) in rows.items():
        want = {"measured": max(2 * seconds, seconds + 20), "bound": seconds + 30, "unmeasured": seconds}[kind]
        assert limit == want, step
    # every row says where its seconds come from (or that none were measured)
    table = script.read_text().split('LIMITS="', 1)[1].split('"', 1)[0]
    assert all(len(line.split(None, 3)) == 4 for line in table.strip().splitlines()), table


def _run_steps(tmp_path: Path, limits: str, steps: str) -> tuple[str, str]:
    """``steps`` (bash, scripts/gpu_common.sh sourced, ``limits`` its table) run into ``tmp_path``:
    its summary.txt and stdout."""
    text = f'set -uo pipefail; OUT={tmp_path}; FAILED=0; LIMITS="{limits}"\nsource scripts/gpu_common.sh\n{steps}'
    done = subprocess.run(["bash", "-c", text], cwd=REPO, capture_output=True, text=True, timeout=120)
    summary = tmp_path / "summary.txt"
    return (summary.read_text() if summary.exists() else ""), done.stdout + done.stderr


def test_a_step_out_of_its_limit_is_said_and_the_next_step_still_runs(tmp_path):
    summary, out = _run_steps(tmp_path, "slow unmeasured 1 a stand-in\nnext unmeasured 60 the next one",
                              "read_limits || exit 1\nstep log slow sleep 300\nstep log next echo left-its-file\n"
                              "step log missing true\necho FAILED=$FAILED")
    assert "== slow (limit 1 s): sleep 300" in summary and "rc=124" in summary
    assert "slow ran out of its 1 s limit: its log holds what it did; going on to the next step" in summary
    assert "== next (limit 60 s)" in summary and "rc=0" in summary
    assert "left-its-file" in (tmp_path / "log.txt").read_text()
    assert "== missing: no row in the step limits table; not run" in summary
    assert "FAILED=2" in out


def test_a_table_row_the_rule_cannot_read_is_one_line(tmp_path):
    _, out = _run_steps(tmp_path, "check measured 9.8 a fraction", "read_limits || echo refused")
    assert "step limits: the row of check reads 'measured 9.8'; write KIND measured, bound or unmeasured" in out
    assert out.strip().endswith("refused")
    _, out = _run_steps(tmp_path, "check timed 10 another kind", "read_limits || echo refused")
    assert "the row of check reads 'timed 10'" in out


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
