"""CI requires what it installs: .ci/run stops in one line without a working nvcc or bubblewrap,
and under KERNEL_LSP_REQUIRE_NVCC / KERNEL_LSP_REQUIRE_SANDBOX / KERNEL_LSP_REQUIRE_TRITON a test
that would skip for want of one fails instead (tests/needs.py, tests/conftest.py). The VS Code setup script run before
`make` says what to run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_tool(folder: Path, name: str, message: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    tool.chmod(0o755)
    return folder


def run_pytest(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # Only what this call asks is required (not what the outer run, e.g. .ci/run, requires).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNEL_LSP_REQUIRE_NVCC": "0", "KERNEL_LSP_REQUIRE_SANDBOX": "0",
           "KERNEL_LSP_REQUIRE_TRITON": "0", **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_ci_run_stops_in_one_line_when_bwrap_cannot_make_namespaces(tmp_path):
    fake = fake_tool(tmp_path / "bin", "bwrap", "bwrap: No permissions to create new namespace")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", ".ci/run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        ".ci/run: bubblewrap cannot create namespaces here (bwrap: No permissions to create new namespace): "
        "allow unprivileged user namespaces"], proc.stderr


def test_ci_run_stops_in_one_line_when_nvcc_does_not_run(tmp_path):
    fake = fake_tool(tmp_path / "bin", "nvcc", "nvcc: broken toolkit")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", ".ci/run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f".ci/run: nvcc ({fake}/nvcc) does not run: nvcc: broken toolkit"]


def test_a_required_sandbox_fails_the_sandbox_tests_instead_of_skipping(tmp_path):
    fake = fake_tool(tmp_path / "bin", "bwrap", "bwrap: No permissions to create new namespace")
    path = {"PATH": f"{fake}:{os.environ['PATH']}"}
    proc = run_pytest(["tests/engine/test_sandbox.py", "tests/engine/test_worker_starts.py"],
                      {**path, "KERNEL_LSP_REQUIRE_SANDBOX": "1"})
    assert proc.returncode == 4 and "passed" not in proc.stdout, proc.stdout  # stopped before any test ran
    assert ("KERNEL_LSP_REQUIRE_SANDBOX=1 but needs a sandbox: candidates run WITHOUT a sandbox: bwrap cannot "
            "create namespaces here (bwrap: No permissions to create new namespace)") in proc.stderr, proc.stderr
    proc = run_pytest(["-ra", "tests/engine/test_sandbox.py"], path)  # not required: skipped, with the reason
    assert proc.returncode == 0 and "skipped" in proc.stdout and "bwrap cannot create namespaces" in proc.stdout


def test_a_required_triton_fails_the_interpreter_tests_instead_of_skipping(tmp_path):
    # Triton and numpy hidden from the child (None entries in sys.modules: find_spec says they are
    # not there), and its TRITON_DIR empty.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['triton'] = sys.modules['numpy'] = None\n")
    hidden = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "KERNEL_LSP_TRITON_DIR": str(tmp_path / "none")}
    proc = run_pytest(["tests/nollm/test_interpreted.py"], {**hidden, "KERNEL_LSP_REQUIRE_TRITON": "1"})
    assert proc.returncode == 4 and "passed" not in proc.stdout, proc.stdout
    assert ("KERNEL_LSP_REQUIRE_TRITON=1 but needs Triton and numpy (its interpreter): triton and numpy not "
            f"installed (here or in {tmp_path / 'none'}; `make test-python` installs them)") in proc.stderr, proc.stderr
    proc = run_pytest(["-ra", "tests/nollm/test_interpreted.py"], hidden)  # not required: skipped, with the reason
    assert proc.returncode == 0 and "skipped" in proc.stdout and "triton and numpy not installed" in proc.stdout, proc.stdout


def test_ci_requires_the_triton_that_make_installs():
    """.ci/run requires Triton because `make test-python` installs it (and numpy) where tests/needs.py
    looks for them."""
    from tests import needs

    make = (ROOT / "Makefile").read_text()
    assert "test-python: setup $(TRITON_DIR)/.done" in make and "TRITON_DIR := $(VENV)/triton-interp\n" in make
    assert '"triton>=3.3,<4" "numpy>=1.26,<3"' in make
    assert needs.TRITON_DIR == ROOT / ".venv" / "triton-interp" or os.environ.get("KERNEL_LSP_TRITON_DIR")
    assert "KERNEL_LSP_REQUIRE_TRITON=1" in (ROOT / ".ci" / "run").read_text()


CHECKS = '''
import pytest
from tests.needs import NVCC_REASON


@pytest.mark.skipif(True, reason=NVCC_REASON + ": (marked)")
def test_marked():
    pass


def test_in_the_body():
    pytest.skip(NVCC_REASON + ": (in the body)")


def test_other_skip():
    pytest.skip("not about nvcc")
'''


def test_a_required_nvcc_turns_its_skips_into_failures(tmp_path):
    (tmp_path / "test_fake_nvcc.py").write_text(CHECKS)
    args = ["-p", "tests.conftest", "--rootdir", str(tmp_path), str(tmp_path / "test_fake_nvcc.py")]
    proc = run_pytest(args, {"KERNEL_LSP_REQUIRE_NVCC": "1"}, cwd=tmp_path)
    assert proc.returncode == 4 and ("KERNEL_LSP_REQUIRE_NVCC=1 but 1 selected tests cannot run: needs nvcc: "
                                     "(marked)") in proc.stderr, proc.stdout + proc.stderr
    proc = run_pytest([*args, "-k", "not marked"], {"KERNEL_LSP_REQUIRE_NVCC": "1"}, cwd=tmp_path)
    assert proc.returncode == 1 and "1 failed, 1 skipped" in proc.stdout, proc.stdout
    assert "KERNEL_LSP_REQUIRE_NVCC=1 but this test cannot run: needs nvcc: (in the body)" in proc.stdout
    proc = run_pytest(args, {}, cwd=tmp_path)
    assert proc.returncode == 0 and "3 skipped" in proc.stdout, proc.stdout


def test_vscode_setup_before_make_says_to_run_make_test():
    proc = subprocess.run(["bash", "editors/vscode/e2e/setup.sh", "/nonexistent/python"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "run `make test`" in proc.stderr and "/nonexistent/python" in proc.stderr
