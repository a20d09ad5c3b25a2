# Shared by scripts/gpu_checks.sh and scripts/gpu_study.sh (sourced, not run): a time-limited step
# that logs into $OUT, the machine's versions, and the offline install of the carried wheels.
# The caller sets OUT, PY and FAILED=0 first.

step() {  # step LOG NAME SECONDS COMMAND...: run under a time limit, output appended to $OUT/LOG.txt
  # (the limit times STEP_LIMIT_SCALE: 1 on a device; a CPU rehearsal's steps time nothing of a device's)
  local log=$1 name=$2 limit=$(( $3 * ${STEP_LIMIT_SCALE:-1} )) start=$SECONDS rc
  shift 3
  if [[ $log == summary ]]; then
    echo "== $name (limit $limit s): $*" | tee -a "$OUT/summary.txt"
  else
    echo "== $name (limit $limit s): $*" | tee -a "$OUT/summary.txt" "$OUT/$log.txt"
  fi
  # timeout signals the command's whole process group (pytest's spawned ranks too)
  timeout -k 5 "$limit" "$@" >> "$OUT/$log.txt" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || FAILED=$((FAILED + 1))
  echo "   rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

env_report() {  # the machine and the versions the figures below were measured with
  nvidia-smi || true
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__,
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
  "$PY" -c "import cupy; print('cupy', cupy.__version__)" || true
  "$PY" -m pip --version
}
install_wheels() {  # each carried wheel on its own (--no-deps): no resolver run against the image's
  # versions and no build of namsa with the image's setuptools, so one mismatch cannot stop the rest;
  # namsa itself runs from the tree (PYTHONPATH=.). Then the versions and `pip check` on the record.
  local wheel rc=0 pip=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null
                        "$PY" -m pip install -q --no-index --no-deps)
  if ! "${pip[@]}" .gpu-wheels/*.whl; then  # one call is fast; if a wheel is refused, the rest one by one
    for wheel in .gpu-wheels/*.whl; do
      "${pip[@]}" "$wheel" || { echo "could not install $wheel"; rc=1; }
    done
  fi
  "$PY" -m pip list --format=freeze
  "$PY" -m pip check || echo "pip check reports the conflicts above (informational: each wheel is installed alone)"
  "$PY" -c "import namsa, stage, models, evaluation, workflow; print('namsa', namsa.__version__, 'from', namsa.__file__)" || rc=1
  return $rc
}
export -f env_report install_wheels
