"""benchmarks/turn_policy.py replays measured benches through the real GPU lock: no two hold the
turn at once, and the quantum (gpu_lock.MIN_TURN_S) is what decides whether a holder hands over
between verify's input sets. A two-bench profile written here; no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _row(task: str, before: float, verify: float) -> dict:
    return {"task": task, "label": f"size:{task}", "wall_s": 1.0, "phases": [
        {"phase": "starting the Worker (spawn, torch import, CUDA init)", "seconds": before, "inside": False},
        {"phase": f"{task}: evaluating", "seconds": 9.0, "inside": False},  # not replayed: the stages are
        {"phase": "verify", "seconds": verify, "inside": True},
        {"phase": "torch compile", "seconds": 0.1, "inside": True},
        {"phase": "timing", "seconds": 0.1, "inside": True},
        {"phase": "handed over", "seconds": 5.0, "inside": True}]}  # (what the measured run waited: not replayed)


@pytest.mark.slow
def test_the_replay_hands_over_between_verify_sets_only_past_the_quantum(tmp_path):
    # A, a Task of 8 GiB inputs, starts at once with 1.5 s of verify (5 sets); B, of 1 MiB, queues
    # 0.3 s later. Without a quantum B's target (expected from its size) comes before A's: A hands
    # over between two sets. With a 3 s quantum A's whole verify is one turn.
    profile = {"command": "test", "device": "none", "when": "now",
               "input_bytes": {"size:a": 8 << 30, "size:b": 1 << 20}, "scenarios": [
        {"mode": "warm", "alone": {"rows": [{"task": "a", "wall_s": 1.7}, {"task": "b", "wall_s": 0.8}]},
         "parallel": {"rows": [_row("a", 0.0, 1.5), _row("b", 0.3, 0.5)]}}]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "turn_policy.py"), "--profile", str(path),
                           "--quanta", "0,3", "--compile-gpu-s", "0.05", "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "out" / "turn_policy.json").read_text())
    (run,) = out["runs"]
    assert run["stages"]["a"]["before"] == 0.0 and run["stages"]["b"]["before"] == 0.3
    assert run["stages"]["a"]["data_bytes"] == 16 << 30  # its outputs taken as large as its inputs
    by_q = {r["quantum_s"]: {b["task"]: b for b in r["benches"]} for r in run["results"]}
    assert all(r["gpu_overlap_s"] == 0 for r in run["results"])  # one holder at a time
    assert by_q[0.0]["b"]["first_turn_s"] < 1.0, by_q[0.0]  # let in between two of A's verify sets
    assert by_q[3.0]["b"]["first_turn_s"] >= 1.5, by_q[3.0]  # A's verify in one turn; B in at A's lend
    assert by_q[0.0]["a"]["handovers"] > by_q[3.0]["a"]["handovers"] >= 1  # (a lend counts: the compile)
    md = (tmp_path / "out" / "turn_policy.md").read_text()
    assert "| measured |" in md and "| 3 |" in md and "--quanta 0,3" in md
    assert "--out-dir" not in out["command"] and str(tmp_path / "out") not in out["command"], out["command"]


def test_an_unreadable_profile_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "turn_policy.py"), "--profile", str(bad),
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("turn_policy: cannot read the profile"), proc.stderr
    assert "Traceback" not in proc.stderr
