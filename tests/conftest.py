"""Shared test setup: the `gpu` marker skips cleanly where no CUDA GPU is visible."""

from __future__ import annotations

import functools
import importlib.util

import pytest


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
    if gpu_items and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device)")
        for item in gpu_items:
            item.add_marker(skip)
