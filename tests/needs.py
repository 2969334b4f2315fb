"""What the tests need from the machine and CI installs: nvcc and a working sandbox (bubblewrap).

Without one, a test skips with a reason that starts with NVCC_REASON or SANDBOX_REASON. Where it
is required, the skip is a failure instead (tests/conftest.py): KERNEL_LSP_REQUIRE_NVCC=1 (the
Makefile's default: the README requires nvcc) and KERNEL_LSP_REQUIRE_SANDBOX=1 (set by .ci/run,
which installs bubblewrap). Use these instead of writing a skip of one's own, so no test that
CI can run is skipped there unseen."""

from __future__ import annotations

import functools
import os

import pytest

from kernel_lsp.engine.caller import sandbox as sb
from kernel_lsp.toolchain.nvcc import find_nvcc

NVCC_REASON = "needs nvcc"
SANDBOX_REASON = "needs a sandbox"
# The variable that turns each kind of skip into a failure, by the reason's first words.
REQUIRED_BY = {NVCC_REASON: "KERNEL_LSP_REQUIRE_NVCC", SANDBOX_REASON: "KERNEL_LSP_REQUIRE_SANDBOX"}

NVCC = find_nvcc(None)
nvcc_missing = f"{NVCC_REASON} (CUDA toolkit): none on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin"
needs_nvcc = pytest.mark.skipif(NVCC is None, reason=nvcc_missing)


@functools.cache
def sandbox_status() -> sb.Status:
    return sb.status()


HAVE_SANDBOX = sandbox_status().available
needs_sandbox = pytest.mark.skipif(not HAVE_SANDBOX, reason=f"{SANDBOX_REASON}: {sandbox_status().message()}")


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
