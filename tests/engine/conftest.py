"""Fixtures shared by the fast-build tests (test_inline_split.py, test_fastbuild_load.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pch_cache(tmp_path_factory):
    """One folder of precompiled torch headers for the session (each takes a minute or two on
    2 cores), so that every fast-build test pays for them once."""
    return tmp_path_factory.mktemp("klsp-pch")


@pytest.fixture
def fast_inline_on_cpu(tmp_path, monkeypatch):
    """Turns the fast path on or off for one test, in a fresh build cache (a CPU build of torch:
    on a GPU the full build runs for a minute; test_inline_split_gpu.py covers it there)."""
    import torch

    from kernel_lsp.engine.worker.build import build

    if torch.cuda.is_available():
        pytest.skip("on a GPU the full build runs for a minute; test_inline_split_gpu.py covers it there")
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_fast_inline", None)  # restored after the test
    return build.configure_fast_inline
