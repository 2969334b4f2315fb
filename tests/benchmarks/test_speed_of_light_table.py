"""The corpus section of benchmarks/speed_of_light_table.py: rows read from a first_bench run."""

from __future__ import annotations

import json

from . import load_script


def load():
    return load_script("speed_of_light_table")


def sol(fraction: float, small: bool = False, ref_ms: float | None = None) -> dict:
    return {"fraction": fraction, "bytes_floor_ms": 0.028, "flop_floor_ms": None, "reference_flop_floor_ms": ref_ms,
            "launch_overhead_sized": small, "label": f"{fraction:.0%} of the H200's memory floor"}


def test_corpus_rows_take_the_warm_alone_benches_and_fire_the_hint_only_where_the_rule_says(tmp_path):
    rows = [
        {"label": "corpus:slow", "verdict": "correct", "custom_kernel": True, "time_ms": 0.28, "speed_of_light": sol(0.10)},
        {"label": "corpus:near", "verdict": "correct", "custom_kernel": True, "time_ms": 0.05, "speed_of_light": sol(0.56)},
        {"label": "corpus:tiny", "verdict": "correct", "custom_kernel": True, "time_ms": 0.01,
         "speed_of_light": sol(0.05, small=True)},
        {"label": "corpus:gemm", "verdict": "correct", "custom_kernel": True, "time_ms": 3.0,
         "speed_of_light": sol(0.01, ref_ms=0.5)},  # compute-bound, own FLOPs unknown: no hint
        {"label": "corpus:rewrite", "verdict": "correct", "custom_kernel": False, "time_ms": 0.3,
         "speed_of_light": sol(0.09)},
        {"label": "corpus:wrong", "verdict": "mismatch", "custom_kernel": True, "time_ms": None, "speed_of_light": None},
        {"label": "medium:relu_new.py", "verdict": "correct", "custom_kernel": True, "time_ms": 0.2,
         "speed_of_light": sol(0.1)},
    ]
    doc = {"device": "NVIDIA H200", "scenarios": [
        {"mode": "fresh", "alone": {"rows": rows[:1]}, "parallel": {"rows": []}},
        {"mode": "warm", "alone": {"rows": rows}, "parallel": {"rows": []}}]}
    src = tmp_path / "first_bench_corpus.json"
    src.write_text(json.dumps(doc))
    got = {r["target"]: r for r in load().corpus_rows(src)}
    assert set(got) == {"slow", "near", "tiny", "gemm", "rewrite"}  # warm only, corpus only, measured only
    assert [n for n, r in got.items() if r["hint"]] == ["slow"]
    assert got["rewrite"]["kind"] == "PyTorch rewrite" and got["tiny"]["launch_overhead_sized"]
    assert list(got)[0] == "gemm"  # sorted by fraction


def test_no_corpus_run_means_no_corpus_rows(tmp_path):
    assert load().corpus_rows(tmp_path / "absent.json") == []


def test_a_corpus_run_of_the_parallel_part_only_is_read_too(tmp_path):
    rows = [{"label": "corpus:slow", "verdict": "correct", "custom_kernel": True, "time_ms": 0.28,
             "speed_of_light": sol(0.10)}]
    src = tmp_path / "first_bench_corpus.json"
    src.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3",
                               "scenarios": [{"mode": "warm", "parallel": {"rows": rows}}]}))
    (row,) = load().corpus_rows(src)
    assert row["target"] == "slow" and row["hint"] and row["device"] == "NVIDIA H100 80GB HBM3"
