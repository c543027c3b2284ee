# Quick start: `make record` (set up, record the method matrix on the embedded default, print the
# breakdown) and `make test` (set up, run the test suite). Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The newest torch profkit supports (CI tests it; analyses/lowest_torch.sh the lowest). PyPI's build is CUDA's,
# which also runs on a CPU. Override for another build: make TORCH="torch==2.15.0 --index-url <wheel index>"
TORCH ?= torch==2.15.0
RECORD_ARGS ?= --all

.PHONY: setup record test test-all test-fast docs clean gpu-wheels gpu-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet "$(TORCH)"
	# DeepSpeed ships as source and imports torch while building: build it against the torch above.
	$(BIN)/pip install --quiet --no-build-isolation "deepspeed>=0.19.8,<0.20"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

record: setup
	$(BIN)/profkit record $(RECORD_ARGS)
	$(BIN)/profkit breakdown traces/

# Every feature end to end, on the method matrix recorded once: what CI runs. Left out (marked `long`): the sweeps
# over whole data sets (the used published figures) and the variants whose mechanism another test already records
# (each loss form, each model family, a user's DDP and FSDP2 scripts under torchrun, the GPU check's install).
# The recording tests and the rest run at once, one process each, on a machine's two cores: the recording tests'
# output follows the rest's, and either failing fails the command.
test: setup
	@log=$$(mktemp); $(BIN)/python -m pytest -m "e2e and not long" > $$log 2>&1 & recording=$$!; \
	$(BIN)/python -m pytest -m "not e2e and not long"; rest=$$?; \
	wait $$recording; recorded=$$?; echo "--- the recording tests (tests/e2e)"; cat $$log; rm -f $$log; \
	test $$rest -eq 0 -a $$recorded -eq 0

# Everything, the long tests too.
test-all: setup
	$(BIN)/python -m pytest

# Every test outside tests/e2e: the pure layers on stored fixtures (core, store, analyze, predict on the meta
# device, report). Nothing is recorded and no program run: a test that tries fails (tests/conftest.py's guard).
test-fast: setup
	$(BIN)/python -m pytest -m "not e2e and not long"

# The settings reference generated from the code (docs/gen_reference.py), then the site (docs/mkdocs.yml) built
# strict into build/site: a broken link fails. tests/test_docs.py checks both.
docs: setup
	$(BIN)/python docs/gen_reference.py
	$(BIN)/mkdocs build --strict --config-file docs/mkdocs.yml

# The GPU check (README, "Checking on a GPU"). gpu-wheels runs where the registry is reached and fills the
# git-ignored .gpu/wheels; gpu-check runs on the GPU machine with its own python3 and torch, installs from
# there and writes its evidence to $$OUT. GPU_CHECK_ARGS: --part train|quant|zero|all, --device, --preset...
gpu-wheels: setup
	$(BIN)/python analyses/gpu_wheels.py

gpu-check:
	python3 analyses/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) traces .gpu
