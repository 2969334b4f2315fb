"""benchmarks/first_bench.py runs as written: its --smoke mode (a tiny CPU Task, CUDA hidden, two
`kernel-lsp bench` processes at once) gives every bench a verdict, its phases and the targets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_smoke_mode_benches_alone_and_two_at_once_and_scores_the_targets(tmp_path):
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "first_bench.py"), "--smoke", "--modes", "fresh",
                             "--parallel", "2", "--out-dir", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # The results so far are on disk while it runs, marked partial: a run cut short (a device
    # call's limit) keeps them.
    results, partial, t0 = tmp_path / "first_bench_smoke.json", None, time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 600:
        if partial is None and results.exists():
            got = json.loads(results.read_text())  # replaced whole: never caught mid-write
            partial = got if got["partial"] else None
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    assert partial is not None and partial["progress"].endswith(" of 4 benches done"), partial
    assert partial["scenarios"][0]["alone"]["rows"][0]["verdict"] == "correct"
    assert stderr.count(", correct, x eager ") == 4, stderr  # a line per bench as it ends
    doc = json.loads((tmp_path / "first_bench_smoke.json").read_text())
    assert doc["partial"] is False and "progress" not in doc and "partial" not in doc["scenarios"][0]
    (scn,) = doc["scenarios"]
    assert scn["mode"] == "fresh" and scn["parallel"]["parallel"] == 2
    for how in ("alone", "parallel"):
        rows = scn[how]["rows"]
        assert len(rows) == 2
        for r in rows:
            assert r["verdict"] == "correct" and r["rc"] == 0, r
            names = [p["phase"] for p in r["phases"]]
            assert any(n.startswith("starting the Worker") for n in names), names
            assert r["gpu_s"] > 0 and r["wall_s"] >= r["gpu_s"], r
            assert r["worker"]["kept"] is False  # fresh: no kept Worker
    results = {t["target"].split(":")[0]: t["result"] for t in scn["targets"]}
    assert set(results) == {"alone", "parallel x2", "parallel"}
    assert all(t["result"] in ("pass", "FAIL", "unknown") for t in scn["targets"])
    text = (tmp_path / "first_bench_smoke.md").read_text()
    assert "partial" not in text
    assert "## fresh, alone" in text and "## fresh, parallel" in text and "### targets (fresh)" in text
    assert "--smoke --modes fresh" in doc["command"]


def test_nothing_to_run_says_so_and_exits_2(tmp_path):
    for args in (["--corpus-only"], ["--how", "neither"], ["--modes", "cold"]):  # --corpus-only: no --corpus N
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_bench.py"), *args, "--out-dir",
                               str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "nothing to run" in proc.stderr, (args, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr


def test_sizing_the_tasks_builds_no_kernel(tmp_path):
    # examples/row_softmax_inline.py calls load_inline at import: sizing its inputs (shapes on the
    # meta device) must not build it (about 85 s of each device run before the first bench).
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import first_bench
    finally:
        sys.path.pop(0)
    env = {"PATH": "/usr/bin:/bin", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    sizes = first_bench.input_bytes([ROOT / "examples" / "row_softmax_inline.py",
                                     ROOT / "benchmarks" / "accuracy_suite" / "kahan_sum.py"], sys.executable, env)
    assert sizes == {str(ROOT / "examples" / "row_softmax_inline.py"): 64 << 20,
                     str(ROOT / "benchmarks" / "accuracy_suite" / "kahan_sum.py"): 16 << 20}
    assert not (tmp_path / "ext").exists() and time.monotonic() - t0 < 60


def _smoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_bench.py"), "--smoke", "--modes", "fresh",
                           "--how", "alone", "--out-dir", str(tmp_path), *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_resume_keeps_the_alone_benches_a_cut_run_finished_and_runs_the_rest(tmp_path):
    device = "CPU (smoke: CUDA hidden)"
    done = {"label": "smoke0", "verdict": "correct", "rc": 0, "wall_s": 1.5, "gpu_s": 0.5, "phases": []}
    prior = {"tasks": ["smoke0", "smoke1"], "device": device, "command": "python benchmarks/first_bench.py --smoke",
             "input_bytes": {}, "partial": True, "scenarios": [
                 {"mode": "fresh", "partial": True, "alone": {"rows": [done], "makespan_s": None, "parallel": 1}}]}
    results = tmp_path / "first_bench_smoke.json"
    results.write_text(json.dumps(prior))
    proc = _smoke(tmp_path, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--resume: 1 fresh/alone benches kept from the earlier run: smoke0" in proc.stderr
    assert proc.stderr.count(", correct, x eager ") == 1, proc.stderr  # smoke1 only
    doc = json.loads(results.read_text())
    (scn,) = doc["scenarios"]
    rows = scn["alone"]["rows"]
    assert [r["label"] for r in rows] == ["smoke0", "smoke1"] and doc["partial"] is False
    assert rows[0]["resumed"] is True and rows[0]["wall_s"] == 1.5 and "resumed" not in rows[1]
    assert rows[1]["verdict"] == "correct" and scn["alone"]["makespan_s"] is None  # not one run's
    assert "| smoke0 (kept) |" in (tmp_path / "first_bench_smoke.md").read_text()
    # Everything kept: nothing runs again.
    proc = _smoke(tmp_path, "--resume")
    assert proc.returncode == 0 and "all 2 benches kept" in proc.stderr and ", x eager " not in proc.stderr
    # Another GPU (or other Tasks): nothing is kept, and it says so.
    doc["device"] = "NVIDIA H200"
    results.write_text(json.dumps(doc))
    proc = _smoke(tmp_path, "--resume")
    assert proc.returncode == 0 and "--resume: nothing to keep" in proc.stderr
    assert proc.stderr.count(", correct, x eager ") == 2
