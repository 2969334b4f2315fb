"""benchmarks/no_llm.py reads each kind of variant from a Task folder's store (real SQLite): a
variant whose evaluation reused the kept baselines (no eager of its own in the store) is read
against the Search's eager and torch.compile, not shown as "-x" (the H100 run of 2026-12-05)."""

from __future__ import annotations

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
