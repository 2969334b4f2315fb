"""`kernel-lsp bench` shows the verdict and the eager ratio as soon as they are known ("torch.compile:
pending (compiling)"), then the complete table; --json stays one document; --timings says when
the early result came. A recorded partial and final (tests/cli/data/early_rowloop.json, a real
CPU run) through the real printing code, and the real CLI on the CPU end to end."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.cli import bench as bench_cli
from kernel_lsp.cli.timings import Phases
from kernel_lsp.model import Evaluation

TASKS = Path(__file__).parent / "tasks"
RECORDED = json.loads((Path(__file__).parent / "data" / "early_rowloop.json").read_text())
PENDING = "torch.compile: pending (compiling)"


def test_the_recorded_partial_prints_its_line_then_the_final_table_replaces_pending():
    part, final = Evaluation.from_dict(RECORDED["partial"]), Evaluation.from_dict(RECORDED["final"])
    out = io.StringIO()
    ns = argparse.Namespace(json=False, _early_out=out, _phases=Phases())
    take = bench_cli._early_taker(ns, "rowloop_new.py")
    take(part)
    early_text = out.getvalue()
    bench_cli._bench_table([final], {"name": None}, ["rowloop_new.py"], [None], out)
    text = out.getvalue()
    first = early_text.splitlines()
    assert len(first) == 1, early_text
    line = first[0]
    assert line.startswith("rowloop_new.py: correct") and line.endswith(PENDING), line
    assert f"{part.speedup_eager:.2f}x eager ±" in line, line
    assert f"eager {part.eager.median_ms:.4g} ±{part.eager.spread_pct:.1f}% ms" in line, line
    assert "PyTorch rewrite" in line  # the kind of result, as the final says it
    # Then the complete result: torch.compile's number where "pending" was.
    table = text[len(early_text):]
    assert "kernel-lsp bench on" in table and PENDING not in table
    assert f"{final.compiled.median_ms:.4g} ±{final.compiled.spread_pct:.1f}%" in table, table
    # --timings: the moment it came, from the command's start.
    assert [m["mark"] for m in ns._phases.to_dict()["marks"]] == [
        "rowloop_new.py: early result (verdict, eager ratio; torch.compile pending)"]
    err = io.StringIO()
    ns._phases.print(err)
    assert "early result (verdict, eager ratio; torch.compile pending): at " in err.getvalue()


def test_json_alone_asks_for_no_early_result():
    assert bench_cli._early_taker(argparse.Namespace(json=True), "x.py") is None


def test_a_disqualified_partial_shows_no_ratio():
    part = Evaluation.from_dict({**RECORDED["partial"], "flags": ["timer_patch", "not_counted"]})
    line = bench_cli.early_line("x.py", part)
    assert "not counted (timer_patch)" in line and "x eager" not in line, line


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    for f in TASKS.glob("rowloop*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNEL_LSP_BASELINE_KEEP_SPREAD", "1000")  # a busy 2-core machine: keep what it measured
    return tmp_path


@pytest.mark.slow
def test_the_real_bench_prints_pending_first_then_the_table_and_nothing_pending_once_kept(workspace, capsys):
    from kernel_lsp.cli import main

    assert main(["bench", "rowloop_new.py", "--timings"]) == 0
    got = capsys.readouterr()
    lines = got.out.splitlines()
    early = [i for i, ln in enumerate(lines) if ln.endswith(PENDING)]
    title = next(i for i, ln in enumerate(lines) if "kernel-lsp bench on" in ln)
    assert len(early) == 1 and early[0] < title, got.out
    assert lines[early[0]].startswith("rowloop_new.py: correct") and "x eager" in lines[early[0]]
    assert "early result (verdict, eager ratio; torch.compile pending): at " in got.err

    # Kept baselines now: nothing is pending, no early line; --json is one document.
    assert main(["bench", "rowloop_new.py", "--json", "--timings"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["targets"][0]["baselines_cached"] is True and doc["timings"]["marks"] == []
    assert main(["bench", "rowloop_new.py"]) == 0
    assert PENDING not in capsys.readouterr().out
