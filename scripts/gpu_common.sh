# Shared by scripts/gpu_checks.sh and scripts/gpu_study.sh (sourced, not run): a time-limited step
# that logs into $OUT, the step limits from each script's table, the machine's versions, and the
# offline install of the carried wheels. The caller sets OUT, PY, FAILED=0 and LIMITS first.
#
# Step limits: each script's LIMITS table has one row per step, in the order it runs them:
#   NAME  KIND  SECONDS  SOURCE (where the seconds come from: RESULTS.md section and date, or why none)
# and one margin rule turns a row into its limit (`step_limit`):
#   measured M   the longest the step took on a lent device, whole seconds rounded up: max(2 M, M + 20);
#   bound B      a step that stops itself at a config bound (a deadline, training.max_wall_s): B + 30
#                (its start-up before the bound counts and its finishing after: the last sample, the export);
#   unmeasured G never timed on its own on a device: the guess G as it is, marked so.
# The limits together must fit COMMAND_BUDGET_S, the seconds of one device command
# (tests/test_gpu_checks_script.py and tests/test_gpu_study_script.py check each script's table).

#: seconds one device command may run: the run tool's 600 s less 30 s for its start and the transfers
COMMAND_BUDGET_S=570

step_limit() {  # step_limit KIND SECONDS: a table row's limit in seconds by the margin rule above
  local kind=$1 s=$2
  [[ $s =~ ^[0-9]+$ ]] || return 1
  case $kind in
    measured) echo $(( 2 * s > s + 20 ? 2 * s : s + 20 )) ;;
    bound) echo $(( s + 30 )) ;;
    unmeasured) echo "$s" ;;
    *) return 1 ;;
  esac
}

read_limits() {  # LIMITS -> LIMIT[NAME] (device seconds), ROW[NAME] ("KIND SECONDS") and LIMIT_NAMES (in
  # table order); one line and status 1 for a row the rule cannot read
  declare -gA LIMIT=() ROW=()
  LIMIT_NAMES=()
  local name kind seconds source
  while read -r name kind seconds source; do
    [[ -z $name || $name == \#* ]] && continue
    if ! LIMIT[$name]=$(step_limit "$kind" "$seconds"); then
      echo "step limits: the row of $name reads '$kind $seconds';" \
           "write KIND measured, bound or unmeasured, then whole seconds"
      return 1
    fi
    ROW[$name]="$kind $seconds"
    LIMIT_NAMES+=("$name")
  done <<< "$LIMITS"
}

print_limits() {  # each step's limit (device seconds, the margin rule above) and their sum against the budget
  local name total=0
  for name in "${LIMIT_NAMES[@]}"; do
    total=$(( total + ${LIMIT[$name]} ))
    printf '   %-34s %4d s  (%s)\n' "$name" "${LIMIT[$name]}" "${ROW[$name]}"
  done
  echo "step limits sum to $total s of the $COMMAND_BUDGET_S s a device command has" \
       "(this run multiplies each by STEP_LIMIT_SCALE=${STEP_LIMIT_SCALE:-1})"
}

step() {  # step LOG NAME COMMAND...: run under NAME's limit (LIMIT), output appended to $OUT/LOG.txt
  # (the limit times STEP_LIMIT_SCALE: 1 on a device; a CPU rehearsal's steps time nothing of a device's).
  # A step that fails or runs out of its limit is counted in FAILED and said in summary.txt; the script
  # goes on to the next step either way, so the call still returns what every step left.
  local log=$1 name=$2 start=$SECONDS rc limit
  shift 2
  if [[ -z ${LIMIT[$name]:-} ]]; then
    echo "== $name: no row in the step limits table; not run (add one to LIMITS)" | tee -a "$OUT/summary.txt"
    FAILED=$((FAILED + 1))
    return
  fi
  limit=$(( ${LIMIT[$name]} * ${STEP_LIMIT_SCALE:-1} ))
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
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "   $name ran out of its $limit s limit: its log holds what it did; going on to the next step" \
      | tee -a "$OUT/summary.txt"
  fi
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
