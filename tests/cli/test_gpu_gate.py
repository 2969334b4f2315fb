"""`make gpu-test` must not pass with every gpu test skipped: KERNEL_LSP_REQUIRE_GPU=1 turns
a missing GPU into a failure, and the preflight refuses an interpreter without a CUDA torch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cuda_available

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(cuda_available(), reason="checks the behaviour without a GPU")


def test_required_gpu_fails_loudly_without_one():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "KERNEL_LSP_REQUIRE_GPU": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           "tests/engine/test_gpu_engine.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "refusing to pass with every gpu test skipped" in proc.stdout + proc.stderr
    env.pop("KERNEL_LSP_REQUIRE_GPU")  # without it, the same run skips cleanly (CI on a CPU)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           "tests/engine/test_gpu_engine.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "skipped" in proc.stdout


def test_preflight_refuses_this_interpreter():
    proc = subprocess.run([sys.executable, "tests/gpu_preflight.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "gpu-test:" in proc.stderr
    assert "Traceback" not in proc.stderr
