"""The real-VS-Code tests skip cleanly where code-server, Chromium or Playwright are not
installed (`editors/vscode/e2e/setup.sh` installs them), unless KERNEL_LSP_REQUIRE_VSCODE_E2E=1
(what CI sets): then anything missing fails the run instead of passing with it skipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.*

from vscode import missing  # noqa: E402

# The server prepares the CUDA build cache in the background when it starts (a torch import
# and maybe a minute of builds); tests/engine/test_build_cache_prepare_lsp.py checks that, and
# here it would only compete with VS Code for the CPU.
os.environ.setdefault("KERNEL_LSP_PREPARE_BUILDS", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vscode_e2e: drives a real VS Code (code-server) in Chromium")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    absent = missing()
    if not absent:
        return
    reason = "not installed: " + "; ".join(absent) + " (run editors/vscode/e2e/setup.sh)"
    if os.environ.get("KERNEL_LSP_REQUIRE_VSCODE_E2E") == "1":
        raise pytest.UsageError(f"KERNEL_LSP_REQUIRE_VSCODE_E2E=1 but the real-VS-Code tests cannot run: {reason}")
    for item in items:
        if "vscode_e2e" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    setattr(item, f"rep_{report.when}", report)  # a failed test leaves a screenshot
    return report
