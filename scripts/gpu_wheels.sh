#!/usr/bin/env bash
# Prepare, on a machine with internet, the wheels a lent GPU machine lacks, so that a session's
# few device minutes go to tests and benchmarks, not installs (the device reaches no registry).
#
#   bash scripts/gpu_wheels.sh            # -> .gpu-wheels/ (git-ignored), then carry it:
#   device run: carry [".gpu-wheels"], command "bash scripts/gpu_checks.sh"
#
# The device image runs Python 3.12 with torch and cupy-cuda13x. PRESENT is its package list as
# ../.library/device/KINDS.md gives it ("Python packages already there", read on a machine on
# 2026-11-17), verbatim: a name not in it is carried even when it is commonly installed beside
# another (pytz, tzdata), since a missing wheel stops the offline install on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY312:-python3.12}
OUT=.gpu-wheels
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform any)
PRESENT="
 absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
 build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
 cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
 equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
 grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
 interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
 lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
 markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
 multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
 nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
 onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
 orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
 prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
 pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
 pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
 scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
 setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
 tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
 torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
 typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
 xxhash yarl zipp "
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
    name = item["metadata"]["name"]
    # image-present.txt: what the image provides of our closure (the rehearsal installs these first)
    print(("#" if norm(name) in present else "") + name + "==" + item["metadata"]["version"])
PYEOF
grep '^#' "$OUT/urls.txt" | tr -d '#' > "$OUT/image-present.txt"
mapfile -t wanted < <(grep -v '^#' "$OUT/urls.txt")
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 "${PLATFORMS[@]}" -d "$OUT" "${wanted[@]}"
rm -f "$report" "$OUT/urls.txt"
# The GPU study's plan, made here so that the device's simulate step reads it instead of planning
# (~45 s of its 200 s on an H200): workflow.plan_cache; scripts/gpu_study.sh sets execution.plan_cache_dir.
# It is signed with a key of its own, made afresh beside the plans (not in them, and not the user's
# ~/.cache key, which never leaves this machine): the device has no other, and gpu_study.sh reads with it.
NAMSA_PLAN_KEY="$PWD/$OUT/plan-cache.key" \
  "${VENV_PY:-.venv/bin/python}" scripts/store_plan.py configs/gpu-study.yaml "$OUT/plans" --wheels "$OUT"
echo "$(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
