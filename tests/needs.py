"""What the tests need from the machine and CI installs: nvcc, a working sandbox (bubblewrap) and
Triton (its interpreter runs the no-LLM path's generated kernels on the CPU).

Without one, a test skips with a reason that starts with NVCC_REASON, SANDBOX_REASON or
TRITON_REASON. Where it is required, the skip is a failure instead (tests/conftest.py):
KERNEL_LSP_REQUIRE_NVCC=1 (the Makefile's default: the README requires nvcc),
KERNEL_LSP_REQUIRE_SANDBOX=1 (set by .ci/run, which installs bubblewrap) and
KERNEL_LSP_REQUIRE_TRITON=1 (set by .ci/run: `make test` installs Triton and numpy on Linux x86-64,
into TRITON_DIR unless .venv's torch brought them). Use these instead of writing a skip of one's
own, so no test that CI can run is skipped there unseen."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest

from kernel_lsp.engine.caller import sandbox as sb
from kernel_lsp.toolchain.nvcc import find_nvcc

NVCC_REASON = "needs nvcc"
SANDBOX_REASON = "needs a sandbox"
TRITON_REASON = "needs Triton"
# The variable that turns each kind of skip into a failure, by the reason's first words.
REQUIRED_BY = {NVCC_REASON: "KERNEL_LSP_REQUIRE_NVCC", SANDBOX_REASON: "KERNEL_LSP_REQUIRE_SANDBOX",
               TRITON_REASON: "KERNEL_LSP_REQUIRE_TRITON"}

NVCC = find_nvcc(None)
nvcc_missing = f"{NVCC_REASON} (CUDA toolkit): none on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin"
needs_nvcc = pytest.mark.skipif(NVCC is None, reason=nvcc_missing)


@functools.cache
def sandbox_status() -> sb.Status:
    return sb.status()


HAVE_SANDBOX = sandbox_status().available
needs_sandbox = pytest.mark.skipif(not HAVE_SANDBOX, reason=f"{SANDBOX_REASON}: {sandbox_status().message()}")


# Triton's interpreter (TRITON_INTERPRET=1) imports numpy; the CPU build of torch needs neither.
# They are in this interpreter (a CUDA build of torch brings Triton), or in TRITON_DIR, where the
# Makefile installs them apart from .venv (there Triton would slow every CPU torch.compile): the
# tests that need them run their code in a subprocess with TRITON_DIR on its path.
TRITON_DIR = Path(os.environ.get("KERNEL_LSP_TRITON_DIR") or Path(__file__).resolve().parents[1] / ".venv" / "triton-interp")
_HERE = [m for m in ("triton", "numpy") if importlib.util.find_spec(m) is not None]
_IN_DIR = [m for m in ("triton", "numpy") if (TRITON_DIR / m / "__init__.py").is_file()]
_MISSING = [m for m in ("triton", "numpy") if m not in _HERE and m not in _IN_DIR]
HAVE_TRITON = not _MISSING
triton_missing = (f"{TRITON_REASON} and numpy (its interpreter): {' and '.join(_MISSING)} not installed "
                  f"(here or in {TRITON_DIR}; `make test-python` installs them)")
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason=triton_missing)


def triton_path() -> list[str]:
    """What a subprocess needs on its PYTHONPATH to import Triton and numpy."""
    return [str(TRITON_DIR)] if _IN_DIR else []


def skip_without_nvcc() -> None:
    """In a test body: skip (or fail, where nvcc is required) without nvcc."""
    if NVCC is None:
        pytest.skip(nvcc_missing)


def required(reason: str) -> str | None:
    """The variable set to 1 that forbids a skip for this reason, if any."""
    for prefix, var in REQUIRED_BY.items():
        if reason.startswith(prefix) and os.environ.get(var) == "1":
            return var
    return None
