#!/usr/bin/env bash
# Every GPU check of the project in one device call (the device tool's 10-minute limit per call):
# install the carried wheels offline, then the gpu-marked tests and the GPU benchmarks, each
# under its own time limit; every output lands in $OUT (8 files: the most that come back).
#
#   here:   bash scripts/gpu_wheels.sh
#   device: run(command="bash scripts/gpu_checks.sh", carry=[".gpu-wheels"], timeout_s=600)
#   then:   record the figures from $OUT in benchmarks/RESULTS.md (date, machine, command).
#
# Not yet run on a GPU (no session so far was lent one): expect to fix small things on first use.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/namsa-gpu-checks}
mkdir -p "$OUT"
PY=${PY:-python3}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "   rc=$? in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi; "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  "$PY" -c "import cupy; print('cupy', cupy.__version__)"; } > "$OUT/env.txt" 2>&1
# limits sum to 585 s: the whole call fits the device tool's 600 s per command
step install 120 "$PY" -m pip install --no-index --find-links .gpu-wheels --no-build-isolation -e .
step pytest-gpu 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider
step bench-train 120 "$PY" benchmarks/bench_train.py --device cuda --max-batch
step bench-simulate 60 "$PY" benchmarks/bench_simulate.py --device cuda --skip-abtem --no-rss
step bench-allreduce 45 "$PY" benchmarks/bench_allreduce.py --gpu
step bench-io-gpu 90 "$PY" benchmarks/bench_io.py --px 256 --samples 8 --workers 2 4 --loaders threads \
  --no-compare --cuda
cat "$OUT/summary.txt"
