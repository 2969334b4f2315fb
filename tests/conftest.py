"""Shared test setup: the `gpu` marker skips cleanly where no CUDA GPU is visible, unless
KERNEL_LSP_REQUIRE_GPU=1 (what `make gpu-test` sets): then a missing GPU, or an interpreter
without torch, fails the run at once instead of passing with everything skipped. Likewise a test
that needs nvcc, a sandbox or Triton (tests/needs.py) fails instead of skipping where
KERNEL_LSP_REQUIRE_NVCC=1 / KERNEL_LSP_REQUIRE_SANDBOX=1 / KERNEL_LSP_REQUIRE_TRITON=1 (the
Makefile's and .ci/run's settings).

Under pytest-xdist (`make test-python` runs `-n 2`), tests go to the worker processes by file (a
file's module-level servers, module fixtures and test order stay in one process), with two
larger units: every file of tests/ray (one Ray cluster per run, not one per process) and every
file that uses the session's precompiled torch headers (`pch_cache`, made once per run); those
two start first, as they take longest."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest

# The language server and the CLI prepare the CUDA build cache in the background when they start
# (caller/pool.py): a pool Worker that imports torch and may build headers for a minute. Tests
# start many servers; the one that checks the preparation turns it on for itself.
os.environ.setdefault("KERNEL_LSP_PREPARE_BUILDS", "0")
# `kernel-lsp bench` keeps its GPU Worker for the next command (caller/keeper.py): no test leaves
# one behind unless it asks (tests/engine/test_keeper.py, and cleans up).
os.environ.setdefault("KERNEL_LSP_KEEP_WORKER", "0")


@functools.cache
def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    refuse_missing_requirements()
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


def refuse_missing_requirements() -> None:
    """KERNEL_LSP_REQUIRE_NVCC=1 / KERNEL_LSP_REQUIRE_SANDBOX=1 / KERNEL_LSP_REQUIRE_TRITON=1 and
    the thing is not here: stop before collecting anything (under xdist too: this runs in the
    controller first), in one line."""
    wanted = [var for var in ("KERNEL_LSP_REQUIRE_NVCC", "KERNEL_LSP_REQUIRE_SANDBOX", "KERNEL_LSP_REQUIRE_TRITON")
              if os.environ.get(var) == "1"]
    if not wanted:
        return
    from tests import needs

    if "KERNEL_LSP_REQUIRE_NVCC" in wanted and needs.NVCC is None:
        raise pytest.UsageError(f"KERNEL_LSP_REQUIRE_NVCC=1 but {needs.nvcc_missing}")
    if "KERNEL_LSP_REQUIRE_SANDBOX" in wanted and not needs.HAVE_SANDBOX:
        raise pytest.UsageError(f"KERNEL_LSP_REQUIRE_SANDBOX=1 but {needs.SANDBOX_REASON}: "
                                f"{needs.sandbox_status().message()}")
    if "KERNEL_LSP_REQUIRE_TRITON" in wanted and not needs.HAVE_TRITON:
        raise pytest.UsageError(f"KERNEL_LSP_REQUIRE_TRITON=1 but {needs.triton_missing}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail the run at once, in one line, when selected tests (after -k / -m) would skip for want
    of what KERNEL_LSP_REQUIRE_NVCC / _SANDBOX / _TRITON says is there (tests/needs.py)."""
    from tests import needs

    wanting: dict[str, list[str]] = {}
    for item in session.items:
        if "gpu" in item.keywords and not cuda_available():
            continue  # skipped for want of a GPU before anything else
        for mark in item.iter_markers("skipif"):
            reason = str(mark.kwargs.get("reason", ""))
            if all(cond is True for cond in mark.args) and mark.args and needs.required(reason):
                wanting.setdefault(reason, []).append(item.nodeid)
    for reason, ids in wanting.items():
        var = needs.required(reason)
        raise pytest.UsageError(f"{var}=1 but {len(ids)} selected tests cannot run: {reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # A skip from inside a test (needs.skip_without_nvcc) for what is required is a failure.
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        from tests import needs

        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        var = needs.required(reason)
        if var:
            report.outcome = "failed"
            report.longrepr = f"{var}=1 but this test cannot run: {reason}"
    return report


ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def shared_scope(path: str) -> str:
    """The unit of a test file under xdist: the file itself, or the group it shares a session
    fixture with."""
    if path.startswith("tests/ray/"):
        return "ray"
    try:
        text = (ROOT / path).read_text(errors="replace")
    except OSError:
        return path
    return "pch" if "pch_cache" in text else path


LONGEST_FIRST = ("ray", "pch")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    # xdist's own loadgroup marks do not reach its scheduler under pytest 9 (it sets item._nodeid,
    # which pytest 9 no longer reads), so the units are made here from the test ids.
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return shared_scope(nodeid.split("::")[0])

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                self.ordered = True
                for scope in reversed(LONGEST_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)
