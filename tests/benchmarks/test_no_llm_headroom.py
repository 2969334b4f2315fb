"""benchmarks/no_llm_headroom.py on the CPU: the floor of a real reference (bytes it must move at
the table bandwidth), how far past torch.compile a kernel at that floor would be, rows it cannot
size said and skipped, a file that is not a no_llm.py result one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "no_llm_headroom.py"


def test_the_floor_and_the_room_past_torch_compile(tmp_path):
    results = tmp_path / "run.json"
    results.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3, torch 2.11.0+cu130", "rows": [
        {"task": "relu", "path": "benchmarks/tasks/relu.py", "eager_ms": 0.0489, "compile_ms": 0.0488,
         "result_vs_eager": 1.0},
        {"task": "row_softmax_inline", "path": "examples/row_softmax_inline.py", "eager_ms": 0.0638,
         "compile_ms": 0.0492, "result_vs_eager": 1.25},  # builds its kernel at import: not here
        {"task": "gone", "path": "benchmarks/corpus/inline_build/gone/reference.py", "eager_ms": 1, "compile_ms": 1},
        {"task": "untimed", "path": "benchmarks/tasks/relu.py"}]}))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--results", str(results), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "no_llm_headroom.json").read_text())
    rows = {r["task"]: r for r in doc["rows"]}
    relu = rows["relu"]
    assert relu["bytes"] == 128 << 20 and relu["bound"] == "bytes"  # 16 Mi floats read, 16 Mi written
    assert relu["bytes_floor_ms"] == pytest.approx((128 << 20) / 3.35e12 * 1e3)
    assert relu["most_past_compile"] == pytest.approx(0.0488 / relu["bytes_floor_ms"])
    # the kept result against torch.compile: eager / result over eager / compile
    assert rows["row_softmax_inline"]["result_vs_compile"] == pytest.approx(1.25 * 0.0492 / 0.0638)
    assert doc["summary"]["tasks"] == 2 and doc["summary"]["tasks_with_room"] == 2
    assert [s.split(":")[0] for s in doc["summary"]["skipped"]] == ["gone", "untimed"]
    assert "| relu | 0.0489 | 0.0488 | bytes |" in (tmp_path / "no_llm_headroom.md").read_text()


def test_a_file_that_is_not_a_result_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--results", str(bad), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("no_llm_headroom: ")
