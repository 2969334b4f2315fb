"""benchmarks/worker_start.py --at-once runs as written: N Engines start their Workers together and
each gets its steps measured (here two CPU Workers; on the device, six, as six benches at once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_workers_started_at_once_each_get_their_steps_measured(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "worker_start.py"), "--device", "cpu",
                           "--at-once", "2", "--sandbox", "off", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "worker_start_x2.json").read_text())
    assert sorted(r["index"] for r in rows) == [0, 1] and all(r["verdict"] == "correct" for r in rows)
    for r in rows:  # each step measured from the common start, in order
        assert 0 < r["ready_s"] <= r["total_s"] and r["warm_s"] >= 0 and r["evaluate_s"] > 0
    text = (tmp_path / "worker_start_x2.md").read_text()
    assert text.startswith("# 2 GPU Workers starting at once") and "--at-once 2 --device cpu --sandbox off" in text
    assert text.count("| correct |") == 2


def test_a_count_below_one_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "worker_start.py"), "--at-once", "-1",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--at-once wants a positive count" in proc.stderr
    assert "Traceback" not in proc.stderr
