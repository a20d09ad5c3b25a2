#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch + Gloo, no MPI/TF/MXNet) once into a wheel cache outside the clone,
# then install that wheel into the venv.
#
# Why a patch: 0.28.1 (the last release, 2023) forces C++14, but torch >= 2.1 headers need C++17
# (see ../shared/FACTS.md). We raise CMAKE_CXX_STANDARD to 17 in the two CMakeLists.txt files.
#
# Usage: scripts/build_horovod.sh [VENV] [--soft]
#   --soft  (used by `make test`): never fail; on a build failure print why, record the reason in
#           $VENV/.horovod-status (the Horovod tests skip with it) and do not retry the build on
#           later soft runs until the cached failure marker is removed (`make horovod` retries).
# Cache: ${NAMSA_WHEEL_CACHE:-~/.cache/namsa/wheels}/<python-tag>-torch<version>/ (the wheel links
# against one torch ABI, so the cache is keyed by Python and torch version).
set -u -o pipefail

VENV=".venv"
SOFT=0
for arg in "$@"; do
  case "$arg" in
    --soft) SOFT=1 ;;
    *) VENV="$arg" ;;
  esac
done
PY="$VENV/bin/python"
HVD_VERSION="0.28.1"
STATUS_FILE="$VENV/.horovod-status"

fail() {
  echo "horovod: $1" >&2
  echo "unavailable: $1" 2>/dev/null > "$STATUS_FILE" || true
  if [ "$SOFT" = 1 ]; then exit 0; fi
  exit 1
}

[ -x "$PY" ] || fail "no Python at $PY; run 'make venv' first"

if "$PY" -c "import horovod.torch" 2>/dev/null; then
  echo "installed" > "$STATUS_FILE"
  echo "horovod: already importable in $VENV"
  exit 0
fi

KEY=$("$PY" -c "import sys, torch; print(f'cp{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__.split(\"+\")[0]}')") \
  || fail "cannot import torch in $VENV"
CACHE_ROOT="${NAMSA_WHEEL_CACHE:-$HOME/.cache/namsa/wheels}"
CACHE="$CACHE_ROOT/$KEY"
FAIL_MARKER="$CACHE/build-failed.txt"
mkdir -p "$CACHE" || fail "cannot create wheel cache $CACHE"

# One build at a time per cache (two `make test` runs may race).
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null; then flock 9; fi

wheel() { ls "$CACHE"/horovod-"$HVD_VERSION"-*.whl 2>/dev/null | head -n1; }

if [ -z "$(wheel)" ]; then
  if [ "$SOFT" = 1 ] && [ -f "$FAIL_MARKER" ]; then
    fail "an earlier build failed ($(head -n1 "$FAIL_MARKER")); run 'make horovod' to retry"
  fi
  rm -f "$FAIL_MARKER"
  LOG="$CACHE/build.log"
  echo "horovod: building $HVD_VERSION wheel into $CACHE (several minutes; log: $LOG)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  STARTED=$SECONDS
  # The steps run in a subshell so that `set -e` stops the build at the first failing step but
  # not this script: the failure marker and status below are always written.
  (
    set -e
    command -v cmake >/dev/null || "$PY" -m pip install -q cmake
    "$PY" -m pip install -q wheel packaging cloudpickle psutil pyyaml
    "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$WORK"
    tar -xzf "$WORK/horovod-$HVD_VERSION.tar.gz" -C "$WORK"
    SRC="$WORK/horovod-$HVD_VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
      "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/horovod/torch/CMakeLists.txt"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GPU=1 \
      "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$CACHE" "$SRC"
  ) > "$LOG" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ -z "$(wheel)" ]; then
    echo "build exited $rc after $((SECONDS - STARTED)) s; see $LOG: $(grep -m1 -iE 'error' "$LOG" | cut -c1-200)" \
      > "$FAIL_MARKER"
    fail "wheel build failed: $(head -n1 "$FAIL_MARKER")"
  fi
  echo "horovod: built $(basename "$(wheel)") in $((SECONDS - STARTED)) s" | tee -a "$LOG"
fi

"$PY" -m pip install -q "$(wheel)" || fail "installing $(wheel) failed"
"$PY" -c "import horovod.torch" || fail "installed $(wheel) but 'import horovod.torch' fails"
echo "installed" > "$STATUS_FILE"
echo "horovod: installed $(basename "$(wheel)") into $VENV"
