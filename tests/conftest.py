"""Shared test setup: the `gpu` marker skips cleanly where no CUDA GPU is visible, unless
KERNEL_LSP_REQUIRE_GPU=1 (what `make gpu-test` sets): then a missing GPU, or an interpreter
without torch, fails the run at once instead of passing with everything skipped."""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest

# The language server and the CLI prepare the CUDA build cache in the background when they start
# (caller/pool.py): a pool Worker that imports torch and may build headers for a minute. Tests
# start many servers; the one that checks the preparation turns it on for itself.
os.environ.setdefault("KERNEL_LSP_PREPARE_BUILDS", "0")


@functools.cache
def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    # Protocol misuse fails LSP tests; pytest-lsp is absent on the device machine.
    if importlib.util.find_spec("pytest_lsp") is not None:
        config.addinivalue_line("filterwarnings", "error::pytest_lsp.LspSpecificationWarning")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not cuda_available() and os.environ.get("KERNEL_LSP_REQUIRE_GPU") == "1":
        import sys

        why = ("this interpreter has no torch" if importlib.util.find_spec("torch") is None
               else "torch sees no CUDA GPU")
        raise pytest.UsageError(f"KERNEL_LSP_REQUIRE_GPU=1 and {len(gpu_items)} gpu tests selected, but {why} "
                                f"({sys.executable}): refusing to pass with every gpu test skipped")
    if gpu_items and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device)")
        for item in gpu_items:
            item.add_marker(skip)
