# `make demo`: set up and check the examples. `make test`: set up and run every test.
PY ?= python3
# Where torch comes from. Empty: the configured index (PyPI by default), where torch 2.13.0 for
# Linux x86-64 is the CUDA 13.0 build and pulls the CUDA libraries as 18 more packages (and Triton);
# TORCH_INDEX=https://download.pytorch.org/whl/cpu gets the CPU build (192 MB wheel) instead.
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
# Triton and numpy for the interpreter tests (test-python, below)
TRITON_DIR := $(VENV)/triton-interp

.PHONY: setup demo test test-python test-editors gpu-test clean test-vscode

$(BIN)/kernel-lsp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so the editable install below does not pick another version
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/kernel-lsp

demo: setup
	$(BIN)/kernel-lsp check examples/

test: test-python test-editors test-vscode

# Two pytest processes (pytest-xdist): many tests wait on Workers, servers and clusters, so the
# other process's builds fill that time. tests/conftest.py keeps each file in one process, and
# tests/ray and the precompiled-header tests together. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
# nvcc is required (the README says so): a test that needs it fails, never skips, without it.
# KERNEL_LSP_REQUIRE_SANDBOX=1 (set by .ci/run, which installs bubblewrap) does the same for the
# sandbox tests; tests/needs.py says how.
KERNEL_LSP_REQUIRE_NVCC ?= 1
KERNEL_LSP_REQUIRE_SANDBOX ?= 0
export KERNEL_LSP_REQUIRE_NVCC KERNEL_LSP_REQUIRE_SANDBOX
test-python: setup $(TRITON_DIR)/.done
	$(BIN)/python -m pytest -q -ra -n $(PYTEST_WORKERS)

# Triton and numpy for tests/nollm/test_interpreted.py (Triton's interpreter runs the no-LLM path's
# generated kernels on the CPU, in a subprocess), in a folder of their own: in .venv, Triton would
# slow every CPU torch.compile of the other tests by about 2 s. Where .venv's torch brings Triton
# (the CUDA build) nothing is installed; off Linux x86-64 there is no Triton wheel, and the tests
# say so. Checked with Triton 3.6 and 3.9.
$(TRITON_DIR)/.done: $(BIN)/kernel-lsp
	mkdir -p $(TRITON_DIR)
	if ! $(BIN)/python -c "import triton, numpy" 2>/dev/null && [ "$$(uname -sm)" = "Linux x86_64" ]; then \
	  $(BIN)/pip install -q --no-compile --target $(TRITON_DIR) "triton>=3.3,<4" "numpy>=1.26,<3"; fi
	touch $@

test-editors: setup
	bash editors/vscode/ci.sh

# A real VS Code (code-server) in Chromium with the .vsix: installs what it needs (Debian, npm,
# PyPI; cached under ~/.cache/kernel-lsp/vscode-e2e) and fails, never skips, when it cannot run.
test-vscode: setup test-editors
	bash editors/vscode/e2e/setup.sh $(BIN)/python

# On a GPU machine: the gpu-marked tests (the server's skip without the LSP packages), with
# GPU_PY, an interpreter that has a CUDA build of torch and pytest (default: .venv's if
# there is one, else python3). It fails, never passes with everything skipped, without a GPU.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-test:
	@$(GPU_PY) tests/gpu_preflight.py || exit 2
	KERNEL_LSP_REQUIRE_GPU=1 $(GPU_PY) -m pytest -q -ra -m gpu tests/engine tests/test_examples.py tests/agent/test_gpu.py tests/test_server_gpu.py tests/cli/test_cli_gpu.py tests/agent/test_whole_model_gpu.py

clean:
	rm -rf $(VENV) .pytest_cache .kernel-lsp
