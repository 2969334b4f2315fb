"""benchmarks/measure_chunks.py on the CPU: one row per chunk size with HOST_CHUNK marked, both
result files written; bad numbers are one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "measure_chunks.py"


def test_it_times_each_chunk_size_and_marks_the_chosen_one(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--elements", "5000", "--repeat", "1", "--out-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "measure_chunks.json").read_text())
    assert [r["chosen"] for r in doc["rows"]].count(True) == 1 and len(doc["rows"]) == 4
    assert "(HOST_CHUNK) | 16 MiB |" in (tmp_path / "measure_chunks.md").read_text()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--repeat", "0", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
