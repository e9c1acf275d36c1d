# Two commands on a fresh machine: `make run` and `make test`. `make setup` is their shared,
# idempotent first step.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.stoker-installed
# torch first, pinned to the CPU wheel this machine carries; GPU users install their own CUDA
# build of torch>=2.11 before `pip install stoker`, and pip then leaves it alone.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run test test-slow lint bench docs gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

run: setup
	$(BIN)/stoker --version
	$(BIN)/stoker bench --model=resnet20 --data_name=cifar10 --batch_size=32 --data_format=NHWC \
		--num_batches=20 --num_warmup_batches=5
	$(BIN)/python examples/quickstart.py

# Two pytest-xdist workers, a test file each at a time (module fixtures are built once, on one
# worker): 467 s against 796 s serially for the default run on the 2-core development machine
# (2026-11-25, 865 tests); `$(BIN)/python -m pytest` alone still runs serially. The tests' own
# Python processes are forked from a zygote that has imported torch (tests/helpers/zygote.py;
# STOKER_TEST_FORK=0 starts fresh interpreters): 397 s against 550 s (2026-11-26, 946 tests).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

# Lint and types: ruff's rules (line length 120 included), the formatter's layout, and mypy on
# src/ (its settings in pyproject.toml's [tool.mypy]).
LINT_PATHS := src tests benchmarks examples docs/_ext
lint: setup
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

bench: setup
	$(BIN)/python benchmarks/overhead.py

# The documentation site (mkdocs.yml) into site/; --strict: a broken link or reference fails it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# On a machine with an NVIDIA GPU and a CUDA build of torch installed for $(PY): the cuda-marked
# tests of the CUDA paths, then the rows that answer issue 41's targets (benchmarks/gpu_check.py
# --plan=targets: resnet20 CUDA graph, the BERT-large shape plain / recipe eager / compiled,
# resnet50 eager and compiled against the plain loop and on real JPEGs; estimated under 9 minutes),
# writing gpu-check.json and gpu-check.md with each target, its threshold and what was measured.
# No venv, no setup, no downloads: `make gpu-check PY=python3`. Without a CUDA device it prints
# why and make exits 0 (the script's own status is 3); other failures keep their status.
# GPU_CHECK_ARGS=--quick (fewer batches), --dry-run (print the plan and its time estimate, run
# nothing) or --plan=full (every row and every cuda-marked test, about 10 minutes or more).
GPU_CHECK_ARGS ?=
gpu-check:
	@PYTHONPATH=src $(PY) benchmarks/gpu_check.py --out gpu-check.json $(GPU_CHECK_ARGS); rc=$$?; \
	if [ $$rc -eq 3 ]; then exit 0; fi; exit $$rc

clean:
	rm -rf $(VENV) build site *.egg-info src/*.egg-info
