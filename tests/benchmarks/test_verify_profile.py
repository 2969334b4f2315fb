"""benchmarks/verify_profile.py on the CPU: the engine's phases and the profile of a Task; a file
that is not a Task is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "verify_profile.py"


def test_it_prints_the_phases_and_where_verify_spends_its_time(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "benchmarks" / "accuracy_suite" / "kahan_sum.py"),
                           "--device", "cpu", "--top", "8"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kahan_sum.py: correct in" in proc.stdout
    assert "verify_s" in proc.stdout and "memory: {'keep': 'device'" in proc.stdout
    assert "Ordered by: cumulative time" in proc.stdout and "verify.py" in proc.stdout
    bad = tmp_path / "not_a_task.py"
    bad.write_text("x = 1\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(bad), "--device", "cpu"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("verify_profile: ")
