"""benchmarks/no_llm.py under a time cap (the H100 run of 2026-12-05: the max-autotune stage ran
past `timeout` after --stop-after, and was killed): max-autotune runs only in what --stop-after
leaves, each number written as it comes, the Tasks it did not reach marked for --resume, which
measures them (rows kept from before keep their data); a SIGTERM writes the rows so far. No GPU:
MEASURE_MAX is replaced by a script that answers without torch, and the optimizes by rows."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import ROOT, load_script
from .test_no_llm_variants import REF

# MEASURE_MAX's interface (argv: the per-Task limit, then the files; a JSON line per file), answering
# eager 2 ms, max-autotune 1 ms; with SLOW_AFTER_FIRST, it hangs after the first file's line.
FAKE_MEASURE = """
import json, sys, time
for i, path in enumerate(sys.argv[2:]):
    print(json.dumps({"path": path, "eager_ms": 2.0, "max_autotune_ms": 1.0}), flush=True)
    if SLOW_AFTER_FIRST:
        time.sleep(60)
"""


def tasks(folder: Path, *names: str) -> list[dict]:
    for name in names:
        (folder / f"{name}.py").write_text(REF)
    return [{"task": n, "path": str(folder / f"{n}.py"), "eager_ms": 0.01} for n in names]


def test_the_time_left_stops_max_autotune_and_marks_the_rest_for_resume(tmp_path, monkeypatch):
    no_llm = load_script("no_llm")
    monkeypatch.setattr(no_llm, "MEASURE_MAX", "SLOW_AFTER_FIRST = True\n" + FAKE_MEASURE)
    monkeypatch.setattr(no_llm, "MAX_AUTOTUNE_MIN_S", 0.5)
    rows = tasks(tmp_path, "a", "b")
    written: list[str] = []
    t0 = time.monotonic()
    no_llm.measure_max_autotune(rows, timeout=90, time_left=3.0, on_row=lambda: written.append(json.dumps(rows)))
    assert time.monotonic() - t0 < 20  # the budget, not 2 x 90 + 120 s
    a, b = rows
    assert a["max_autotune_vs_eager"] == 2.0 and "max_autotune_skipped" not in a
    assert json.loads(written[0])[0]["max_autotune_vs_eager"] == 2.0  # written as it came, before the stop
    assert "max_autotune_error" not in b and "--stop-after ran out" in b["max_autotune_skipped"]
    assert no_llm.max_autotune_pending(rows) == [b]


def test_too_little_time_left_starts_no_max_autotune(tmp_path, monkeypatch, capsys):
    no_llm = load_script("no_llm")

    def no_process(*args, **kwargs):
        raise AssertionError("max-autotune started with no time for it")

    monkeypatch.setattr(no_llm.subprocess, "Popen", no_process)
    rows = tasks(tmp_path, "a", "b")
    no_llm.measure_max_autotune(rows, timeout=90, time_left=-12.0)
    assert all(r["max_autotune_skipped"] == "0 s of --stop-after left, 60 s needed" for r in rows), rows
    assert "max-autotune: skipped for 2 Task(s)" in capsys.readouterr().err
    assert no_llm.max_autotune_pending(rows) == rows  # a --resume run measures them
    no_llm.write(rows, tmp_path / "out", "python benchmarks/no_llm.py", "test")
    md = (tmp_path / "out.md").read_text()
    assert "| a | 0.0100 | -x | not yet |" in md and "max-autotune not measured yet" in md and ": a, b" in md


def test_an_old_runs_unread_reference_reads_not_yet_in_the_table(tmp_path):
    """Runs before 2026-12-06 wrote NO_REFERENCE where the corpus was not on the machine: a --resume
    measures such a row, so the table says "not yet", not a bare "-x"."""
    no_llm = load_script("no_llm")
    a, b, c = tasks(tmp_path, "a", "b", "c")
    a["max_autotune_error"] = no_llm.NO_REFERENCE
    b["max_autotune_error"] = "no CUDA GPU visible: max-autotune is measured on the GPU"  # an answer: "-x"
    # c: a --no-max-autotune run's row, never measured; d: not a Task at all (no row in the table)
    d = {"task": "d", "path": "d.py", "skipped": "not a module Task (no Model/get_inputs)"}
    assert no_llm.max_autotune_pending([a, b, c, d]) == [a, c]
    no_llm.write([a, b, c, d], tmp_path / "out", "python benchmarks/no_llm.py", "test")
    md = (tmp_path / "out.md").read_text()
    assert "| a | 0.0100 | -x | not yet |" in md and "| b | 0.0100 | -x | -x |" in md
    assert "| c | 0.0100 | -x | not yet |" in md
    assert "max-autotune not measured yet" in md and md.split("max-autotune not measured yet")[1].split("\n")[0].endswith(": a, c")


def test_the_max_autotune_stage_gets_only_what_stop_after_leaves(tmp_path, monkeypatch):
    """The killed run's shape: --stop-after spent on the optimizes, then max-autotune: not started."""
    no_llm = load_script("no_llm")
    monkeypatch.setattr(no_llm, "run_task", lambda path, *_: time.sleep(0.2) or tasks(tmp_path, path.stem)[0])
    monkeypatch.setattr(no_llm.subprocess, "Popen", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("started")))
    rows: list[dict] = []
    saved: list[int] = []
    args = argparse.Namespace(stop_after=0.1, timeout=90.0, budget=8, no_max_autotune=False)
    no_llm.run_all([tmp_path / "a.py", tmp_path / "b.py"], rows, args, lambda: saved.append(len(rows)))
    assert [r["task"] for r in rows] == ["a"]  # b not started past --stop-after
    assert "0 s of --stop-after left" in rows[0]["max_autotune_skipped"] and saved == [1]


def max_autotune_only(monkeypatch, never: str):
    """no_llm with the fake MEASURE_MAX (its processes recorded in ``started``) and no optimize
    allowed (``never`` says why)."""
    no_llm = load_script("no_llm")
    monkeypatch.setattr(no_llm, "MEASURE_MAX", "SLOW_AFTER_FIRST = False\n" + FAKE_MEASURE)
    started: list[list[str]] = []
    real = no_llm.subprocess.Popen
    monkeypatch.setattr(no_llm.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or real(cmd, **kw))
    monkeypatch.setattr(no_llm, "run_task", lambda *a: (_ for _ in ()).throw(AssertionError(never)))
    return no_llm, started


def test_a_resume_measures_max_autotune_for_the_kept_rows_without_it(tmp_path, monkeypatch):
    no_llm, started = max_autotune_only(monkeypatch, "a kept Task ran again")
    a, b, c, d = tasks(tmp_path, "a", "b", "c", "d")
    a["max_autotune_vs_eager"] = 1.5  # measured before
    b["variant_tuned"] = {"verdict": "correct", "vs_eager": 1.2}  # killed before its max-autotune
    c["max_autotune_skipped"] = "0 s of --stop-after left, 60 s needed"  # no time left then
    d["max_autotune_error"] = "no CUDA GPU visible: max-autotune is measured on the GPU"  # an answer: kept
    out = tmp_path / "no_llm_full"
    out.with_suffix(".json").write_text(json.dumps({"command": "python benchmarks/no_llm.py --resume",
                                                    "rows": [a, b, c, d]}))
    rc = no_llm.main([*(r["path"] for r in (a, b, c, d)), "--resume", "--stop-after", "300", "--out", str(out)])
    assert rc == 0
    assert [Path(x).name for x in started[0][-2:]] == ["b.py", "c.py"] and len(started) == 1, started
    got = {r["task"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert got["a"] == a and got["d"] == d  # kept as they were
    assert got["b"] == {**b, "max_autotune_vs_eager": 2.0}  # its other data kept
    assert got["c"] == {k: v for k, v in c.items() if k != "max_autotune_skipped"} | {"max_autotune_vs_eager": 2.0}
    assert "not yet" not in out.with_suffix(".md").read_text()


# A no_llm.py run whose optimizes are rows made at once; the Task named STOP_AT sends the run a
# SIGTERM, as `timeout` does at its cap, and then would take long.
DRIVER = """
import importlib.util, os, signal, sys, time
spec = importlib.util.spec_from_file_location("no_llm", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)

def run_task(path, budget, timeout):
    if path.stem == os.environ["STOP_AT"]:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    return {"task": path.stem, "path": str(path), "seconds": 1.0}

m.run_task = run_task
sys.exit(m.main(sys.argv[2:]))
"""


def test_a_sigterm_writes_the_rows_so_far_and_resume_goes_on(tmp_path):
    tasks(tmp_path, "x", "y", "z")
    out = tmp_path / "out"

    def run(stop_at: str, *more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "benchmarks" / "no_llm.py"),
                               *(str(tmp_path / f"{n}.py") for n in "xyz"), "--out", str(out), "--no-max-autotune",
                               *more], env={**os.environ, "STOP_AT": stop_at}, capture_output=True, text=True,
                              timeout=120)

    first = run("y")
    assert first.returncode == 143 and "stopped by SIGTERM" in first.stderr, first.stderr[-2000:]
    assert [r["task"] for r in json.loads(out.with_suffix(".json").read_text())["rows"]] == ["x"]
    assert "| x |" in out.with_suffix(".md").read_text()
    second = run("", "--resume")
    assert second.returncode == 0, second.stderr[-2000:]
    assert [r["task"] for r in json.loads(out.with_suffix(".json").read_text())["rows"]] == ["x", "y", "z"]


def test_only_runs_the_named_tasks_in_the_order_given_and_names_an_unknown_one(tmp_path, monkeypatch, capsys):
    no_llm = load_script("no_llm")
    ran: list[str] = []
    monkeypatch.setattr(no_llm, "run_task", lambda path, *_: ran.append(path.stem) or tasks(tmp_path, path.stem)[0])
    tasks(tmp_path, "a", "b", "c")
    paths = [str(tmp_path / f"{n}.py") for n in "abc"]
    out = tmp_path / "out"
    assert no_llm.main([*paths, "--only", "c,a", "--no-max-autotune", "--out", str(out)]) == 0
    assert ran == ["c", "a"]  # the nearest misses first, as asked, not the table's order
    assert no_llm.main([*paths, "--only", "c,zz", "--no-max-autotune", "--out", str(out)]) == 2
    assert "no such Task: zz" in capsys.readouterr().err and ran == ["c", "a"]


def test_redo_replaces_a_row_in_place_and_keeps_its_max_autotune(tmp_path, monkeypatch):
    no_llm = load_script("no_llm")
    a, b = tasks(tmp_path, "a", "b")
    a.update(max_autotune_vs_eager=1.5, kept_vs_eager=1.1, budget=8)
    out = tmp_path / "out"
    out.with_suffix(".json").write_text(json.dumps({"command": "python benchmarks/no_llm.py", "rows": [a, b]}))
    monkeypatch.setattr(no_llm, "run_task", lambda path, budget, timeout: {
        "task": path.stem, "path": str(path), "kept_vs_eager": 1.3, "budget": budget})
    args = [a["path"], b["path"], "--out", str(out), "--no-max-autotune"]
    assert no_llm.main([*args, "--redo", "--only", "a"]) == 2  # --redo works on the rows of --out
    assert no_llm.main([*args, "--resume", "--redo", "--only", "a", "--budget", "24"]) == 0
    got = json.loads(out.with_suffix(".json").read_text())
    assert [r["task"] for r in got["rows"]] == ["a", "b"] and got["rows"][1] == b
    assert got["rows"][0] == {"task": "a", "path": a["path"], "kept_vs_eager": 1.3, "budget": 24,
                              "max_autotune_vs_eager": 1.5}
    assert got["command"].startswith("python benchmarks/no_llm.py ; python benchmarks/no_llm.py")


def test_max_autotune_only_measures_the_missing_numbers_of_the_named_rows_in_order(tmp_path, monkeypatch):
    no_llm, started = max_autotune_only(monkeypatch, "an optimize ran")
    a, b, c, d = tasks(tmp_path, "a", "b", "c", "d")
    b["max_autotune_error"] = no_llm.NO_REFERENCE  # an older run on a machine without the corpus: pending
    d["max_autotune_vs_eager"] = 1.7
    gone = dict(tasks(tmp_path, "e")[0], path=str(tmp_path / "elsewhere" / "e.py"))  # not on this machine
    out = tmp_path / "out"
    out.with_suffix(".json").write_text(json.dumps({"command": "x", "rows": [a, b, c, d, gone]}))
    assert no_llm.main(["--resume", "--max-autotune-only", "--only", "d,c,b,e", "--out", str(out)]) == 0
    assert [Path(x).name for x in started[0][-2:]] == ["c.py", "b.py"] and len(started) == 1, started
    got = {r["task"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert got["a"] == a and got["d"] == d  # not named / already measured
    assert got["b"]["max_autotune_vs_eager"] == 2.0 and "max_autotune_error" not in got["b"]
    assert got["c"]["max_autotune_vs_eager"] == 2.0
    # a reference not on this machine is a later run's to measure, not an error of the Task
    assert "not readable here" in got["e"]["max_autotune_skipped"] and "max_autotune_error" not in got["e"]
