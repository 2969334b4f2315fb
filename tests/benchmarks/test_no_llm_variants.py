"""benchmarks/no_llm.py reads each kind of variant from a Task folder's store (real SQLite): a
variant whose evaluation reused the kept baselines (no eager of its own in the store) is read
against the Search's eager and torch.compile, not shown as "-x" (the H100 run of 2026-12-05)."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.model import Candidate, Evaluation, Task, Timing
from kernel_lsp.store import Store, store_path

from . import load_script

GENERATED = "import triton\n@triton.jit\ndef k(x_ptr):\n    pass\nLAUNCHERS = {}\n"


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, min_ms=ms, max_ms=ms, spread_pct=1.0, runs=5)


def test_a_variant_without_its_own_baselines_reads_against_the_searchs(tmp_path):
    no_llm = load_script("no_llm")
    path = store_path(tmp_path)
    path.parent.mkdir(parents=True)
    task = Task(name="bias_gelu", reference_path=str(tmp_path / "bias_gelu.py"), reference_source="x = 1\n")
    gen = Candidate(source=GENERATED, kind="python", note="Triton kernels generated from torch.compile (default)")
    tuned = Candidate(source=GENERATED + "# XBLOCK 1024\n", kind="python", note="k: XBLOCK 2048 -> 1024")
    with Store(path) as store:
        store.record(task, gen, Evaluation(task="bias_gelu", candidate=gen.id, verdict="correct", correct=True,
                                           time=timing(0.08), eager=timing(0.16), compiled=timing(0.07)))
        store.record(task, tuned, Evaluation(task="bias_gelu", candidate=tuned.id, verdict="correct", correct=True,
                                             time=timing(0.05)))  # kept baselines: none stored with it
    got = no_llm.variants(tmp_path, 0.15, 0.075)
    assert got["variant_generated"]["vs_eager"] == 0.16 / 0.08 and got["variant_generated"]["baselines"] == "measured with it"
    assert abs(got["variant_tuned"]["vs_eager"] - 0.15 / 0.05) < 1e-9
    assert abs(got["variant_tuned"]["vs_compile"] - 0.075 / 0.05) < 1e-9 and got["variant_tuned"]["baselines"] == "the Search's"
    # Without the Search's numbers either: unknown, not made up.
    assert no_llm.variants(tmp_path)["variant_tuned"]["vs_eager"] is None


REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.relu()


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []
"""


def test_max_autotune_is_measured_for_every_task_in_one_process(tmp_path, monkeypatch):
    """After the optimizes, one process measures max-autotune for every row that has no number
    yet (one torch import for the run); each row gets its number or a sentence, never nothing.
    Here (no GPU) the sentence says why; a row already measured is left alone."""
    import torch

    no_llm = load_script("no_llm")
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text(REF)
    rows = [{"task": "a", "path": str(tmp_path / "a.py")}, {"task": "b", "path": str(tmp_path / "b.py")},
            {"task": "c", "path": str(tmp_path / "c.py"), "max_autotune_vs_eager": 1.5},
            {"task": "d", "skipped": "not a module Task"}, {"task": "e", "path": str(tmp_path / "missing.py")}]
    calls = []
    real = no_llm.subprocess.Popen

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(no_llm.subprocess, "Popen", counting)
    no_llm.measure_max_autotune(rows, timeout=120)
    assert len(calls) == 1 and [Path(x).name for x in calls[0][-2:]] == ["a.py", "b.py"], calls
    a, b, c, d, e = rows
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in a["max_autotune_error"] and "no CUDA GPU" in b["max_autotune_error"], (a, b)
    else:
        assert a["max_autotune_vs_eager"] > 0 and b["max_autotune_vs_eager"] > 0, (a, b)
    assert c == {"task": "c", "path": str(tmp_path / "c.py"), "max_autotune_vs_eager": 1.5}
    assert "max_autotune_error" not in d
    # a reference not on this machine: left for a run that has it, not an error of the Task
    assert "not readable here" in e["max_autotune_skipped"] and "max_autotune_error" not in e
    no_llm.measure_max_autotune(rows, timeout=120)  # nothing left to measure here: no process
    assert len(calls) == 1
