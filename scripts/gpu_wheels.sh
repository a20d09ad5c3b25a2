#!/usr/bin/env bash
# Prepare, on a machine with internet, the wheels a lent GPU machine lacks, so that a session's
# few device minutes go to tests and benchmarks, not installs (the device reaches no registry).
#
#   bash scripts/gpu_wheels.sh            # -> .gpu-wheels/ (git-ignored), then carry it:
#   device run: carry [".gpu-wheels"], command "bash scripts/gpu_checks.sh"
#
# The device image (../.library/device/KINDS.md, read 2026-11-17) runs Python 3.12 with torch,
# cupy-cuda13x, numpy, scipy, matplotlib, pandas, safetensors, xxhash, tqdm, rich, psutil,
# tensorboard, scikit-image, pytest and pytest-timeout already installed: only the rest of our
# runtime closure is downloaded (about 40 MB; the carry limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY312:-python3.12}
OUT=.gpu-wheels
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform any)
# Present on the device image (KINDS.md, "Python packages already there"): not carried.
PRESENT=" numpy scipy matplotlib pandas safetensors xxhash tqdm rich psutil tensorboard scikit-image pytest
 pytest-timeout pyyaml threadpoolctl networkx sympy requests joblib tabulate pillow packaging typing-extensions
 filelock fsspec jinja2 markupsafe mpmath contourpy cycler fonttools kiwisolver pyparsing python-dateutil six
 certifi charset-normalizer idna urllib3 markdown-it-py mdurl pygments imageio tifffile lazy-loader msgpack
 cloudpickle toolz sortedcontainers psutil click pluggy iniconfig pytz tzdata wrapt attrs zipp grpcio protobuf
 absl-py markdown werkzeug tensorboard-data-server setuptools wheel pip torch triton "
rm -rf "$OUT" && mkdir -p "$OUT"
report=$(mktemp)
# Resolve our runtime dependencies (pyproject [project.dependencies], torch excluded) for 3.12.
deps=$("$PY" - <<'PYEOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith("torch")))
PYEOF
)
mapfile -t deps <<<"$deps"
"$PY" -m pip install -q --dry-run --ignore-installed --report "$report" --only-binary=:all: --python-version 3.12 \
  "${PLATFORMS[@]}" --target "$(mktemp -d)" "${deps[@]}"
"$PY" - "$report" "$PRESENT" > "$OUT/urls.txt" <<'PYEOF'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n.lower())
present = {norm(n) for n in sys.argv[2].split()}
for item in json.load(open(sys.argv[1]))["install"]:
    if norm(item["metadata"]["name"]) not in present:
        print(item["metadata"]["name"] + "==" + item["metadata"]["version"])
PYEOF
mapfile -t wanted < "$OUT/urls.txt"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 "${PLATFORMS[@]}" -d "$OUT" "${wanted[@]}"
rm -f "$report" "$OUT/urls.txt"
echo "$(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
