#!/usr/bin/env bash
# The dev-split study of issue 22 item 3 (benchmarks/RESULTS.md "Physics inputs and loss weighting"):
# four variants of configs/physics-dev.yaml, same data and seeds, each trained in its own process,
# each scored on the dev split by `namsa evaluate`; prints potential relative L2 overall and on light
# materials (every element Z <= 14) for the network, iCoM (least-squares fitted) and the mean image.
#   benchmarks/physics_inputs_study.sh DATA OUT [SEEDS...]      (DATA: a quickstart-sized store dir)
# VARIANTS="base relative" picks a subset, so that two shells can share the work (one torch thread
# each: OMP_NUM_THREADS=1).
set -euo pipefail
data=$1; out=$2; shift 2
seeds=${*:-0}
cfg=configs/physics-dev.yaml
declare -A variants=(
  [base]=""
  [physics]="--set model.physics_inputs=[com_y,com_x,icom]"
  [relative]="--set training.loss_weighting=relative"
  [both]="--set model.physics_inputs=[com_y,com_x,icom] --set training.loss_weighting=relative"
)
for seed in $seeds; do
  for name in ${VARIANTS:-base physics relative both}; do
    run=$out/$name-s$seed
    [ -f "$run/eval-dev/metrics.json" ] && continue
    # shellcheck disable=SC2086
    namsa train $cfg --data "$data" --out "$run" --set training.seed=$seed ${variants[$name]} > "$out/$name-s$seed.train.log" 2>&1
    namsa evaluate $cfg --data "$data" --model "$run" --out "$run/eval-dev" > "$out/$name-s$seed.eval.log" 2>&1
  done
done
python benchmarks/physics_inputs_table.py "$out" || true
