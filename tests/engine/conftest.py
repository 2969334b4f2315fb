"""Fixtures shared by the fast-build tests (test_inline_split.py, test_fastbuild_load.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pch_cache(tmp_path_factory):
    """One folder of precompiled torch headers for the session (each takes a minute or two on
    2 cores), so that every fast-build test pays for them once."""
    return tmp_path_factory.mktemp("klsp-pch")
