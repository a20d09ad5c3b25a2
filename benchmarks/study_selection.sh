#!/usr/bin/env bash
# The dev-split choice of the study's training recipe (issue 22, items 3 and 6; benchmarks/RESULTS.md
# "the study's recipe, chosen on dev"): each variant of configs/study.yaml trained data-parallel on 2
# gloo ranks with the paper's bitvector engine (2 x 4 samples per step, lr 5e-4 per rank -> 1e-3 after
# the linear scaling with workers, the study's single-process schedule), then scored on the DEV split
# by `namsa evaluate` (noise-free and at the config's doses). The test split is not touched.
#   benchmarks/study_selection.sh DATA OUT            (DATA: runs/study/data after `namsa simulate`)
# VARIANTS="adam larc" picks a subset. The table: python benchmarks/study_selection_table.py OUT
set -euo pipefail
data=$1; out=$2
cfg=configs/study.yaml
mkdir -p "$out"
parallel=(--set distributed.engine=bitvector --set distributed.backend=gloo
          --set training.batch_size=4 --set training.lr0=0.0005)
declare -A variants=(
  [adam]="--set training.optimizer=adam"
  [larc]="--set training.optimizer=larc_adam"
  [relative]="--set training.optimizer=adam --set training.loss_weighting=relative"
  [physics]="--set training.optimizer=adam --set model.physics_inputs=[com_y,com_x,icom]"
  [residual]="--set training.optimizer=adam --set model.physics_inputs=[com_y,com_x,icom] --set model.icom_residual=true"
  [long]="--set training.optimizer=adam --set training.max_steps=4800 --set training.decay_every=1600"
  [light4]="--set training.optimizer=adam --set training.max_steps=4800 --set training.decay_every=1600 --set data.light_oversample=4"
  [longer]="--set training.optimizer=adam --set training.max_steps=7200 --set training.decay_every=2400"
)
for name in ${VARIANTS:-adam larc relative physics residual long longer light4}; do
  run=$out/$name
  if [ ! -f "$run/model/model_card.json" ]; then
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 -m workflow.cli train \
      $cfg --data "$data" --out "$run" --no-progress "${parallel[@]}" ${variants[$name]} > "$out/$name.train.log" 2>&1
  fi
  [ -f "$run/eval-dev/metrics.json" ] || namsa evaluate $cfg --data "$data" --model "$run" --out "$run/eval-dev" \
    --no-progress --set evaluation.split=dev --set evaluation.n_bootstrap=200 \
    --set evaluation.ptycho=false --set evaluation.multislice_ptycho=null > "$out/$name.eval.log" 2>&1
done
python benchmarks/study_selection_table.py "$out"
