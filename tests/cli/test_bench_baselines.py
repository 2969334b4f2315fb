"""`kernel-lsp bench` keeps the baselines in the workspace store: a second run reuses them (no
torch.compile), `--remeasure-baselines` times them again, `--timings` says where the seconds
went. The real CLI, the real Engine on the CPU, a real SQLite store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernel_lsp.cli import main

TASKS = Path(__file__).parent / "tasks"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for f in TASKS.glob("rowloop*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    # A busy 2-core machine times noisily: keep what it measured (tests/engine/test_baselines.py
    # shows the spread rule).
    monkeypatch.setenv("KERNEL_LSP_BASELINE_KEEP_SPREAD", "1000")
    return tmp_path


def bench(capsys, *flags: str) -> tuple[dict, str]:
    rc = main(["bench", "rowloop_new.py", "--json", *flags])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert rc == 0, doc
    return doc, captured.err


@pytest.mark.slow
def test_a_second_bench_reuses_the_baselines_and_the_flag_measures_them_again(workspace, capsys):
    first, _ = bench(capsys)
    second, err = bench(capsys, "--timings")
    again, _ = bench(capsys, "--remeasure-baselines")
    a, b, c = (d["targets"][0] for d in (first, second, again))
    assert a["baselines_cached"] is False and b["baselines_cached"] is True and c["baselines_cached"] is False
    assert (b["eager_ms"], b["compile_ms"], b["eager_spread_pct"], b["compile_spread_pct"]) == (
        a["eager_ms"], a["compile_ms"], a["eager_spread_pct"], a["compile_spread_pct"])
    assert b["baselines_measured_at"] == a["baselines_measured_at"] < c["baselines_measured_at"]
    assert isinstance(b["eager_spread_pct"], float) and isinstance(b["compile_spread_pct"], float)
    assert (workspace / ".kernel-lsp" / "store.sqlite").exists()

    # --timings: the caller's phases and the Worker's, in the JSON and on stderr.
    phases = {p["phase"]: p["seconds"] for p in second["timings"]["phases"]}
    assert "starting the Worker (spawn, torch import, CUDA init)" in phases, phases
    assert "torch compile" in phases  # the phase is shown; b["baselines_cached"] above says it compiled nothing
    assert "interpreter start and imports" in phases and second["timings"]["total_s"] > 0
    assert "kernel-lsp bench --timings" in err and "starting the Worker" in err
    assert "timings" not in first  # only when asked

    main(["bench", "rowloop_new.py"])
    out = capsys.readouterr().out
    assert "baselines kept from" in out and "--remeasure-baselines" in out
    assert out.count("±") >= 4  # eager and torch.compile with their spreads, both ratios with theirs
