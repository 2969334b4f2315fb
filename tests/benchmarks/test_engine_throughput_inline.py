"""engine_throughput.py --engine-inline: the KernelBench-format Search phase runs end to end on the
CPU against a stand-in Engine (the GPU run is the lead's: see docs/fast-builds.md), its variants
are real edits of every task, and its row lands in the results' summary table."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import engine_throughput, inline_search
from tests.agent.fakes import FakeEngine


def test_every_task_gets_three_distinct_variants_that_change_one_number():
    for name in engine_throughput.TASK_NAMES:
        src = (inline_search.TASKS / f"{name}_new.py").read_text()
        found = inline_search.variants(src)
        assert len(found) == 3 and len({s for s, _ in found}) == 3 and all(s != src for s, _ in found), name
        for new, note in found:  # one number changed, everything else as written
            assert len(new.splitlines()) == len(src.splitlines()) and note, (name, note)


def test_the_phase_runs_a_search_per_task_at_once_and_reports_the_rate():
    names = engine_throughput.TASK_NAMES
    res: dict = {}
    engine = FakeEngine(delay=0.02)  # wall_s is rounded to 10 ms
    out = asyncio.run(inline_search.run_phase(engine, names, res, log=lambda *_: None))
    assert res["inline_search"] is out and [r["task"] for r in out["searches"]] == names
    assert all("error" not in r for r in out["searches"]), out["searches"]
    # the start and its three variants, each evaluated once per Search (confirmation re-timings aside)
    assert all(r["evaluated"] == 4 for r in out["searches"]), out["searches"]
    assert out["candidates"] == 40 and (60 * 40 / (out["wall_s"] + 0.006) <= out["per_gpu_min"]
                                     <= 60 * 40 / max(out["wall_s"] - 0.006, 1e-3))  # wall_s is rounded to 10 ms
    starts = [o for o in engine.options if o == {"baselines": False}]
    assert len(starts) >= 40  # the start too: baselines are the Task's, measured once elsewhere
    row = inline_search.markdown_row(out)
    assert "KernelBench format" in row and f"n={out['candidates']}" in row


def test_only_inline_keeps_the_results_table_with_the_row(tmp_path):
    args = engine_throughput.parse_args(["--only-inline", "--engine-inline", "10"])
    assert args.only_inline and engine_throughput.inline_names(args) == engine_throughput.TASK_NAMES
    res = {"meta": {}, "setup": {}, "device": {"name": "FakeGPU"}, "candidates": [], "errors": []}
    asyncio.run(inline_search.run_phase(FakeEngine(), ["relu", "row_max"], res, log=lambda *_: None))
    _, md = engine_throughput.write_results(res, tmp_path)
    text = md.read_text()
    assert "KernelBench format (ModelNew + load_inline), 2 tasks' Searches at once" in text
    assert (tmp_path / "engine_throughput.json").exists()
