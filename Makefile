# The two README commands: `make demo` and `make test`. Both create .venv on first use; the `namsa`
# command is then .venv/bin/namsa (or `namsa` after `. .venv/bin/activate`).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= -m "not slow"

.PHONY: venv demo notebook test test-all test-slurm study study-scaling pretrained horovod horovod-cached bench bench-workflow clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "namsa needs Python 3.11 or newer; run e.g. make PYTHON=python3.11 $(MAKECMDGOALS)")'
	@echo "make: creating the virtual environment $(VENV) ..."
	$(PYTHON) -m venv $(VENV)
	@echo "make: upgrading pip in $(VENV) ..."
	$(PY) -m pip install -q --upgrade pip
	@# The CPU build of torch first, so nothing below pulls the CUDA wheels.
	@echo "make: installing torch 2.13.0 (CPU build) ..."
	$(PY) -m pip install -q torch==2.13.0
	@echo "make: installing namsa (editable) with its test and baseline extras (numpy, pymatgen, abTEM, py4DSTEM, ...): about a minute, quiet until done ..."
	$(PY) -m pip install -q -e '.[dev]'
	@echo "make: $(VENV) is ready"
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/namsa run configs/quickstart.yaml --out runs/quickstart

# notebooks/ in JupyterLab, run from the venv (its kernel imports this checkout). JupyterLab is large
# and only this target needs it, so it is installed into the venv on first use, not with [dev].
# NOTEBOOK_ARGS go to `jupyter lab` (e.g. --no-browser --port 8890, or --allow-root in a root container).
NOTEBOOK_ARGS ?=
notebook: venv
	@$(PY) -c 'import jupyterlab' 2>/dev/null || { echo "make: installing jupyterlab into $(VENV) (first use only) ..."; \
	  $(PY) -m pip install -q jupyterlab; }
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(NOTEBOOK_ARGS)

# The study (docs/evaluation.md, "The study"): ~2,000 samples of AFLOW prototypes and the library, the
# scan-space reconstructor trained data-parallel (2 gloo ranks), scored on structure types it never saw
# against iCoM, converged ptychography, multislice ptychography and the mean image, noise-free and at
# three doses. The recipe was chosen on the dev split: benchmarks/study_selection.sh.
study: venv
	$(VENV)/bin/namsa run configs/study.yaml --out runs/study

# Its learning curve over 4 training-set sizes (hours more on 2 cores; not part of `make study`).
study-scaling: study
	$(VENV)/bin/namsa scaling configs/study.yaml --data runs/study/data --out runs/study/scaling \
	  --fractions 0.015625,0.0625,0.25,1 --set training.max_steps=$(SCALING_STEPS) \
	  --set training.decay_every=$$(( $(SCALING_STEPS) / 3 ))
# the study's own schedule (training.max_steps 4800, decay every 1600): the full-size point is the study run
SCALING_STEPS ?= 4800

# Publish the study's reconstructor as the shipped pretrained:study-scan (models/pretrained/).
pretrained: study
	$(VENV)/bin/namsa publish runs/study study-scan --into-package

test: venv horovod-cached
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-all: venv
	$(PY) -m pytest -m ""

# The slurm profile against a real one-node Slurm on localhost (docs/cluster.md): installs Debian's
# slurm-wlm and munge when their daemons are missing (needs root and apt-get), then runs the slow
# test that starts the cluster (scripts/slurm_localhost.sh), runs `namsa run` on it and stops it.
test-slurm: venv
	@if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then \
	  echo "make: installing slurm-wlm and munge (apt-get) ..."; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge; fi
	OMP_NUM_THREADS=1 $(PY) -m pytest -m slow -v tests/test_slurm_real.py

horovod: venv
	bash scripts/build_horovod.sh $(VENV)

# make test exercises Horovod: install the cached patched wheel (build it once if absent). Never
# fails: on a build failure it says why and the Horovod tests skip with that reason.
horovod-cached: venv
	-bash scripts/build_horovod.sh $(VENV) --soft

# Every benchmark script (figures are appended by hand to benchmarks/RESULTS.md).
bench: venv
	for script in benchmarks/bench_*.py; do echo "== $$script"; $(PY) $$script || exit $$?; done

# Wall time of the quickstart by stage and Parsl's share of it.
bench-workflow: venv
	$(PY) benchmarks/bench_workflow.py

clean:
	rm -rf runs .pytest_cache
