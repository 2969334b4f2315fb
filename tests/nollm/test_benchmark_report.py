"""benchmarks/no_llm.py's report on the CPU: which variant a stored candidate is, each kind's best read
from a real store, and the issue's targets computed from the rows (pass and fail both shown)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kernel_lsp.model import Candidate, Evaluation, Task, Timing
from kernel_lsp.nollm import eager_ops, graphs
from kernel_lsp.nollm.writer import write_model_new
from kernel_lsp.store import Store, store_path

from .fixtures import load

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("no_llm_bench", ROOT / "benchmarks" / "no_llm.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _sources():
    ref, code, args = load("l1_softmax_split")
    gen = write_model_new(ref, code, args)
    eager = eager_ops.apply(gen.source, next(iter(gen.eager.values())))
    tuned = gen.source.replace("XBLOCK=1024, num_warps=4", "XBLOCK=512, num_warps=4")
    return ref, gen.source, tuned, eager, graphs.graphed(gen.source)


def test_kind_of_each_variant():
    ref, gen, tuned, eager, graphed = _sources()
    note = "Triton kernels generated from torch.compile (default): 5 Triton kernels"
    assert bench.kind_of(ref + "\nclass ModelNew(Model):\n    pass\n", "") is None
    assert bench.kind_of(gen, note) == "generated"
    assert bench.kind_of(tuned, "k: XBLOCK 1024 -> 512") == "tuned"
    assert bench.kind_of(eager, "k left to eager (aten.sub)") == "eager_kept"
    assert bench.kind_of(graphed, "the whole forward replayed from one CUDA graph") == "graphed"


def _ev(cand: str, ms: float, verdict: str = "correct", flags=()) -> Evaluation:
    return Evaluation(task="sm", candidate=cand, verdict=verdict, correct=verdict == "correct",
                      time=Timing(ms, ms, ms, 1.0, 50), eager=Timing(0.01, 0.01, 0.01, 1.0, 50), compiled=Timing(0.02, 0.02, 0.02, 1.0, 50),
                      flags=list(flags))


def test_variants_read_from_the_store(tmp_path):
    ref, gen, tuned, eager, graphed = _sources()
    task = Task(name="sm", reference_path="sm.py", reference_source=ref)
    with Store(store_path(tmp_path)) as store:
        for source, note, ms, flags in [
                (gen, "Triton kernels generated from torch.compile (default): 5 Triton kernels", 0.1, ()),
                (tuned, "k: XBLOCK 1024 -> 512", 0.05, ()), (eager, "k left to eager", 0.04, ()),
                (graphed, "the whole forward replayed from one CUDA graph", 0.005, ("cuda_graph", "not_counted"))]:
            cand = Candidate(source=source, kind="python", origin="tuner", note=note)
            store.record(task, cand, _ev(cand.id, ms, flags=flags))
    got = bench.variants(tmp_path)
    assert set(got) == {"variant_generated", "variant_tuned", "variant_eager_kept", "variant_graphed"}
    assert abs(got["variant_generated"]["vs_eager"] - 0.1) < 1e-9
    assert got["variant_graphed"]["flags"] == ["cuda_graph"]


def test_targets_and_report(tmp_path):
    rows = [
        {"task": "a", "eager_ms": 0.01, "compile_vs_eager": 1.5, "result_vs_eager": 1.8, "best_vs_eager": 1.8,
         "seconds": 40.0,
         "generated_verdict": "correct", "variant_graphed": {"verdict": "correct", "vs_eager": 3.0,
                                                             "flags": ["cuda_graph"]}},
        {"task": "b", "eager_ms": 0.01, "compile_vs_eager": 0.7, "result_vs_eager": 1.0, "seconds": 30.0,
         "generated_verdict": "correct", "label": "eager kept: the reference's own forward"},
        {"task": "c", "eager_ms": 0.01, "compile_vs_eager": 1.2, "result_vs_eager": 1.0, "seconds": 200.0,
         "generated_verdict": "not made"},
        {"task": "d", "skipped": "not a module Task"},
    ]
    t = bench.targets(rows)
    assert t["tasks"] == 3 and t["correct_standalone"] == "2/3" and not t["correct_standalone_ok"]
    assert t["never_slower_ok"] and t["at_least_10pct_faster_than_compile"] == ["a"] and t["quarter_ok"]
    assert t["geomean_ok"] and t["fastest_task_s"] == 30.0
    bench.write(rows, tmp_path / "out", "python benchmarks/no_llm.py", "test")
    md = (tmp_path / "out.md").read_text()
    assert "| a | 0.0100 | 1.50x |" in md and "3.00x (cuda_graph: not counted)" in md
    assert "2/3 (NOT met)" in md and "fastest 30 s (met)" in md
