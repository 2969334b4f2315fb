"""benchmarks/first_bench.py keeps what it measured when a time cap kills it (the H100 run of
2026-12-05: 34 warm benches, killed at 330 s, nothing written): the results files are rewritten after
every bench, marked partial until all are done; a SIGTERM writes them and exits non-zero; stderr has
one line per bench as it ends. The benches here are a stand-in interpreter (``--python``), no GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import ROOT, load_script

# The `--python` of the run: `-c INPUT_BYTES ...` says no sizes; `-m kernel_lsp.cli bench NAME ...`
# answers at once, except a Task named slow*, which runs until killed (its pid in slow.pid).
FAKE_PYTHON = """#!/bin/sh
case "$1" in -c) echo '{}'; exit 0 ;; esac
case "$4" in *slow*) echo $$ > "$FAKE_DIR/slow.pid"; exec sleep 60 ;; esac
echo "verdict: correct" >&2
echo '{"targets": [{"verdict": "correct", "speedup_eager": 1.5, "speedup_compile": 0.9}]}'
"""


def fake_run(tmp_path: Path, names: list[str], *more: str) -> subprocess.Popen:
    python = tmp_path / "fakepy"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    for name in names:
        (tmp_path / f"{name}.py").write_text("x = 1\n")
    return subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "first_bench.py"),
                             *(str(tmp_path / f"{n}.py") for n in names), "--modes", "fresh", "--python", str(python),
                             "--out-dir", str(tmp_path / "out"), *more], env={**os.environ, "FAKE_DIR": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def row(label: str) -> dict:
    return {"label": label, "task": f"t_{label}", "rc": 0, "wall_s": 2.0, "verdict": "correct",
            "speedup_eager": 1.5, "speedup_compile": 0.9}


def test_results_say_partial_until_every_bench_is_done(tmp_path):
    fb = load_script("first_bench")
    doc = {"when": "now", "command": "python benchmarks/first_bench.py --modes warm", "device": "H100",
           "input_bytes": {}, "scenarios": [], "tasks": ["a", "b"]}
    fresh = {"mode": "fresh", "alone": {"rows": [row("a"), row("b")], "makespan_s": 4.0, "parallel": 1}, "targets": []}
    prior = {**doc, "command": "python benchmarks/first_bench.py --modes fresh", "scenarios": [fresh]}
    warm = {"mode": "warm", "partial": True, "alone": {"rows": [row("a")], "makespan_s": None, "parallel": 1}}
    for _ in range(2):  # a write after each bench: the earlier run's command joined once, not per write
        text = fb.write_results(tmp_path, "first_bench", fb.results_doc(doc, [warm], prior, ["warm"], 2))
    got = json.loads((tmp_path / "first_bench.json").read_text())
    assert got["partial"] is True and got["progress"] == "1 of 2 benches done"
    assert [s["mode"] for s in got["scenarios"]] == ["fresh", "warm"]  # the other mode's run kept beside it
    assert got["command"] == f"{prior['command']}; {doc['command']}"
    assert (tmp_path / "first_bench.md").read_text() == text
    assert "**partial: 1 of 2 benches done**" in text and "## warm, alone, partial (1 at a time" in text
    assert "### targets (warm)" not in text and "### targets (fresh)" in text
    assert not list(tmp_path.glob("*.tmp"))

    del warm["partial"]  # run_scenario's end: the scenario done, its targets scored
    warm.update(alone={"rows": [row("a"), row("b")], "makespan_s": 4.0, "parallel": 1}, targets=[])
    text = fb.write_results(tmp_path, "first_bench", fb.results_doc(doc, [warm], prior, ["warm"], 2))
    got = json.loads((tmp_path / "first_bench.json").read_text())
    assert got["partial"] is False and "progress" not in got and "partial" not in text
    assert "## warm, alone (1 at a time; makespan 4.0 s)" in text and "### targets (warm)" in text


def test_a_line_per_bench_and_the_complete_results(tmp_path):
    proc = fake_run(tmp_path, ["a", "b"], "--how", "alone")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.count("x eager 1.5, x compile 0.9, rc 0") == 2 and "a.py: " in err and "b.py: " in err, err
    got = json.loads((tmp_path / "out" / "first_bench.json").read_text())
    assert got["partial"] is False and [r["label"] for r in got["scenarios"][0]["alone"]["rows"]] == ["a.py", "b.py"]


def test_a_sigterm_writes_the_benches_done_and_exits_non_zero(tmp_path):
    proc = fake_run(tmp_path, ["a", "slow", "b"], "--how", "alone,parallel", "--parallel", "2")
    results, t0 = tmp_path / "out" / "first_bench.json", time.monotonic()
    # Alone, one at a time: a is done (written), slow runs until the SIGTERM, b never starts.
    while not ((tmp_path / "slow.pid").exists() and results.exists()) and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    assert proc.poll() is None and results.exists(), proc.communicate()[1] if proc.poll() is not None else "no results"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    got = json.loads(results.read_text())
    assert got["partial"] is True and got["progress"] == "1 of 6 benches done"
    (scn,) = got["scenarios"]
    assert scn["partial"] is True and [r["label"] for r in scn["alone"]["rows"]] == ["a.py"]
    text = (tmp_path / "out" / "first_bench.md").read_text()
    assert "**partial: 1 of 6 benches done**" in text and "| a.py |" in text
    assert "a.py: " in err and "SIGTERM" in err
    assert gone_after(int((tmp_path / "slow.pid").read_text()), 10)  # the running bench ended with it


def gone_after(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` ended (gone, or a zombie left to be reaped) within ``seconds``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False
