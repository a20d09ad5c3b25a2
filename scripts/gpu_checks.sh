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
# Each step's limit comes from the LIMITS table below (seconds measured on the lent devices, their
# source, and the margin rule of scripts/gpu_common.sh); the limits are printed at the start of
# summary.txt with their sum, which tests/test_gpu_checks_script.py keeps within the 570 s of one device
# command (`NAMSA_GPU_LIMITS_ONLY=1 bash scripts/gpu_checks.sh` prints them and does nothing else); it
# also checks that every gpu-marked test file is run below. A step that fails or runs out of its limit
# is said in summary.txt and the next step runs. $OUT receives 8 files (the most that come back from a
# device call): summary, install, gpu-tests, and a log and a JSON for each benchmark plus bench-io's log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/namsa-gpu-checks}
PY=${PY:-python3}
REHEARSAL=${NAMSA_GPU_REHEARSAL:-0}
FAILED=0
T0=$SECONDS
source scripts/gpu_common.sh   # step, step limits, env_report, install_wheels

# NAME KIND SECONDS SOURCE, in the order the steps run (KIND and the margin rule: scripts/gpu_common.sh).
# RESULTS.md "GPU: the first device run" and "GPU: the second device run" (both 2026-11-26, one H200);
# the fifth round: that session's log on a lent H200 (commit ed42493). The steps not timed one by one
# (env, rng, ring events and the three benchmarks) took at most 94 s together in the first run's 201 s
# call (201 s less install 22 s and the four timed test files' 85 s).
LIMITS="
env                              unmeasured 10 never timed alone: nvidia-smi, the torch and cupy imports, pip --version
install                          measured   22 first run 22 s; second 18-21 s; fifth round 10 s
tests/test_dataset.py            measured    9 second run 9 s; first 6 s
tests/test_distributed_gpu.py    measured   20 second run 20 s (NCCL); first 18 s
tests/test_multislice.py         measured   23 second run 23 s; first 22 s
tests/test_train.py              measured   51 second run 51 s; first 39 s
tests/test_rng_devices.py        unmeasured 20 passed in both runs, its time not recorded
tests/test_loader_ring_events.py unmeasured 25 passed in both runs, its time not recorded
tests/test_resident_data.py      unmeasured 20 added after the second run (commit 109babb): never run on a device
bench-simulate                   unmeasured 90 ran in both runs, its time not recorded
bench-train                      unmeasured 90 ran in both runs, its time not recorded
bench-io                         unmeasured 35 ran in both runs, its time not recorded
"
read_limits || exit 1
if [[ ${NAMSA_GPU_LIMITS_ONLY:-0} == 1 ]]; then
  print_limits
  exit 0
fi
mkdir -p "$OUT"

gpu_tests() {  # gpu_tests FILE: the gpu tests of one file (rehearsal: their collection)
  local file=$1
  if [[ $REHEARSAL == 1 ]]; then
    step gpu-tests "$file" "$PY" -u -m pytest -m gpu --collect-only -q -p no:cacheprovider "$file"
  else
    step gpu-tests "$file" "$PY" -u -m pytest -m gpu -q -p no:cacheprovider -rs "$file"
  fi
}

gpu_step() {  # gpu_step LOG NAME PY -u SCRIPT ARGS...: a GPU benchmark (rehearsal: its --help,
  if [[ $REHEARSAL == 1 ]]; then  # which imports the script and its top-level modules)
    step "$1" "$2" "${@:3:3}" --help
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
print_limits | tee -a "$OUT/summary.txt"
step summary env bash -c env_report
# Offline and from the carried wheels only: no pip configuration or find-links of the machine.
step install install bash -c install_wheels

gpu_tests tests/test_dataset.py
gpu_tests tests/test_distributed_gpu.py
gpu_tests tests/test_multislice.py
gpu_tests tests/test_train.py
gpu_tests tests/test_rng_devices.py
gpu_tests tests/test_loader_ring_events.py
gpu_tests tests/test_resident_data.py

gpu_step bench-simulate bench-simulate "$PY" -u benchmarks/bench_simulate.py --device cuda --grids 256 512 \
  --skip-abtem --no-rss --json "$OUT/bench_simulate.json"
gpu_step bench-train bench-train "$PY" -u benchmarks/bench_train.py --device cuda --presets paper \
  --json "$OUT/bench_train.json"
gpu_step bench-io bench-io "$PY" -u benchmarks/bench_io.py --px 256 --samples 4 --workers 4 --loaders threads \
  --no-compare --cuda

echo "total $((SECONDS - T0)) s, $FAILED step(s) failed" | tee -a "$OUT/summary.txt"
[[ $FAILED -eq 0 ]]
