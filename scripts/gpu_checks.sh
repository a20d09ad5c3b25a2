#!/usr/bin/env bash
# Every GPU check of the project in one device call of under 9 minutes on a fresh H100/H200 machine
# (Python 3.12, torch and cupy preinstalled, no network): install the carried wheels offline without
# their dependencies, run namsa from the tree (PYTHONPATH=.), run the gpu-marked tests file by file
# (one bad module cannot stop the others), then bench_simulate and bench_train, each step under its own time limit, unbuffered.
#
#   here:   bash scripts/gpu_wheels.sh
#   device: run(command="bash scripts/gpu_checks.sh", carry=[".gpu-wheels"], timeout_s=600)
#   then:   record the figures from $OUT in benchmarks/RESULTS.md (date, machine, command).
#
# Rehearsal here, without a GPU (NAMSA_GPU_REHEARSAL=1): a fresh Python 3.12 venv (no system site
# packages) gets torch and the packages the device image already holds from the registry, then
# the same offline install from .gpu-wheels, `pytest -m gpu --collect-only` of every file and each
# benchmark's --help (its imports); nothing runs on a GPU. PY312 names the interpreter (python3.12).
#
# The step limits (the numbers after each step's names) sum to 535 s: tests/test_gpu_checks_script.py
# keeps them under 540 s and checks that every gpu-marked test file is run below. $OUT receives 8
# files (the most that come back from a device call): summary, install, gpu-tests, and a log and
# a JSON for each benchmark plus bench-io's log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/namsa-gpu-checks}
mkdir -p "$OUT"
PY=${PY:-python3}
REHEARSAL=${NAMSA_GPU_REHEARSAL:-0}
FAILED=0
T0=$SECONDS
source scripts/gpu_common.sh   # step, env_report, install_wheels

gpu_tests() {  # gpu_tests FILE SECONDS: the gpu tests of one file (rehearsal: their collection)
  local file=$1 limit=$2
  if [[ $REHEARSAL == 1 ]]; then
    step gpu-tests "collect $file" "$limit" "$PY" -u -m pytest -m gpu --collect-only -q -p no:cacheprovider "$file"
  else
    step gpu-tests "$file" "$limit" "$PY" -u -m pytest -m gpu -q -p no:cacheprovider -rs "$file"
  fi
}

gpu_step() {  # gpu_step LOG NAME SECONDS PY -u SCRIPT ARGS...: a GPU benchmark (rehearsal: its --help,
  if [[ $REHEARSAL == 1 ]]; then  # which imports the script and its top-level modules)
    step "$1" "$2 --help" "$3" "${@:4:3}" --help
  else
    step "$@"
  fi
}

rehearsal_venv() {  # a fresh Python 3.12 venv standing in for the device image (see the header)
  local venv=${NAMSA_REHEARSAL_VENV:-/tmp/namsa-gpu-rehearsal-venv}
  rm -rf "$venv"
  "${PY312:-python3.12}" -m venv "$venv" || return 1
  # the image's own packages (torch, setuptools, pytest, ... and those of our closure it holds)
  "$venv/bin/python" -m pip install -q torch==2.13.0 setuptools wheel pytest pytest-timeout hypothesis \
    -r .gpu-wheels/image-present.txt || return 1
  PY=$venv/bin/python
}

if [[ $REHEARSAL == 1 ]]; then
  start=$SECONDS
  rehearsal_venv || { echo "rehearsal: could not build the Python 3.12 venv" | tee -a "$OUT/summary.txt"; exit 1; }
  echo "rehearsal venv (not part of the device budget) in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  T0=$SECONDS
fi

export PY
# namsa from this tree, in every child process too (pytest's spawned ranks, the benchmarks' children)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step summary env 10 bash -c env_report
# Offline and from the carried wheels only: no pip configuration or find-links of the machine.
step install install 40 bash -c install_wheels   # 10-22 s on the lent H200s (RESULTS.md)

gpu_tests tests/test_dataset.py 25
gpu_tests tests/test_distributed_gpu.py 60
gpu_tests tests/test_multislice.py 30
gpu_tests tests/test_train.py 90
gpu_tests tests/test_rng_devices.py 20
gpu_tests tests/test_loader_ring_events.py 25
gpu_tests tests/test_resident_data.py 20

gpu_step bench-simulate bench-simulate 90 "$PY" -u benchmarks/bench_simulate.py --device cuda --grids 256 512 \
  --skip-abtem --no-rss --json "$OUT/bench_simulate.json"
gpu_step bench-train bench-train 90 "$PY" -u benchmarks/bench_train.py --device cuda --presets paper \
  --json "$OUT/bench_train.json"
gpu_step bench-io bench-io 35 "$PY" -u benchmarks/bench_io.py --px 256 --samples 4 --workers 4 --loaders threads \
  --no-compare --cuda

echo "total $((SECONDS - T0)) s, $FAILED step(s) failed" | tee -a "$OUT/summary.txt"
[[ $FAILED -eq 0 ]]
