# The two README commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= -m "not slow"

.PHONY: venv demo test test-all horovod horovod-cached bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing below pulls the CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/namsa run configs/quickstart.yaml --out runs/quickstart

test: venv horovod-cached
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-all: venv
	$(PY) -m pytest -m ""

horovod: venv
	bash scripts/build_horovod.sh $(VENV)

# make test exercises Horovod: install the cached patched wheel (build it once if absent). Never
# fails: on a build failure it says why and the Horovod tests skip with that reason.
horovod-cached: venv
	-bash scripts/build_horovod.sh $(VENV) --soft

clean:
	rm -rf runs .pytest_cache
