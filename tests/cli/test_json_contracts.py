"""What `bench --json` and `optimize --json` promise scripts and editors, and the sentences
the text output builds from the same facts: the real Engine on the CPU (both baselines run
there), the real Store, and the scripted OpenAI-compatible server for the LLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernel_lsp.agent.search import SearchResult
from kernel_lsp.cli import main
from kernel_lsp.cli.numbers import REWRITE_LABEL, speedup_text
from kernel_lsp.cli.optimize import search_facts, summary_lines
from kernel_lsp.model import Candidate, Evaluation, Timing

from tests.agent.openai_server import start

TASKS = Path(__file__).parent / "tasks"
MV = (TASKS / "rowloop_new.py").read_text().replace(
    "        out = torch.empty(x.shape[0], dtype=x.dtype)\n        for i in range(x.shape[0]):\n"
    "            out[i] = torch.dot(x[i], ones)\n", "        out = torch.mv(x, ones)\n")


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for f in TASKS.glob("rowloop*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


@pytest.mark.slow
def test_bench_json_has_both_baselines_spreads_and_kind(workspace, capsys):
    rc = main(["bench", "rowloop_new.py", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["status"] == 0
    (t,) = doc["targets"]
    for key in ("time_ms", "eager_ms", "compile_ms", "spread_pct", "eager_spread_pct", "compile_spread_pct",
                "speedup_eager", "speedup_compile", "speedup_eager_spread_pct", "speedup_compile_spread_pct"):
        assert isinstance(t[key], float), key
    assert t["custom_kernel"] is False and t["label"] == REWRITE_LABEL  # plain PyTorch, no kernel of its own
    assert t["speedup_eager_spread_pct"] == max(t["spread_pct"], t["eager_spread_pct"])
    rc = main(["bench", "rowloop_new.py"])
    out = capsys.readouterr().out
    assert rc == 0 and "PyTorch rewrite" in out and ("±" in out or "~" in out)


@pytest.mark.slow
def test_optimize_json_contract_with_baselines(workspace, capsys):
    server = start([f"one mv\n```python\n{MV}```\n"], default="")
    try:
        rc = main(["optimize", "rowloop_new.py", "--model", "m", "--base-url", server.base_url,
                   "--budget", "1", "--json"])
    finally:
        server.close()
    doc = json.loads(capsys.readouterr().out)
    assert "reason" in doc and "failed_steps" in doc
    for key in ("speedup_eager", "speedup_compile", "custom_kernel", "spread", "measurement", "label"):
        assert key in doc, key
    assert doc["eager_ms"] and doc["compile_ms"]  # both baselines ran on the CPU
    # Rewrites count by default (kernels_only off): the one-mv rewrite of the row loop is offered,
    # labelled as a PyTorch rewrite, never as a kernel.
    assert rc == 0 and doc["improved"] is True, doc
    assert doc["custom_kernel"] is False and doc["label"] == REWRITE_LABEL
    assert doc["speedup_eager"] > 1 and doc["speedup_compile"] and doc["spread"] is not None
    assert doc["measurement"] == "confirmation"


def _timing(ms: float, spread: float = 1.0) -> Timing:
    return Timing(median_ms=ms, min_ms=ms, max_ms=ms, spread_pct=spread, runs=10)


def _result(best_ms: float, best_spread: float, custom: str) -> SearchResult:
    start = Candidate(source="class ModelNew: pass\n", kind="python")
    best = Candidate(source=custom, kind="python", origin="llm", parent=start.id)
    start_ev = Evaluation(task="t", candidate=start.id, verdict="correct", correct=True, time=_timing(1.0),
                          eager=_timing(1.0), compiled=_timing(0.13))
    best_ev = Evaluation(task="t", candidate=best.id, verdict="correct", correct=True,
                         time=_timing(best_ms, best_spread))
    return SearchResult(search_id=1, task="t", state="done", reason="proposal budget spent (4/4)", improved=True,
                        start=start, start_evaluation=start_ev, best=best, best_evaluation=best_ev,
                        speedup=1.0 / best_ms, confirmed=True, candidates_evaluated=5, usage={}, steps=[],
                        ranking=[])


def test_summary_says_torch_compile_is_faster():
    # MinGPTNewGelu on the H200: 5.38x eager, but torch.compile runs it in 0.130 ms vs 0.213 ms.
    result = _result(0.213, 1.0, "from torch.utils.cpp_extension import load_inline\n")
    facts = search_facts(result)
    assert facts["compile_beats_best"] is True and facts["custom_kernel"] is True
    assert round(facts["speedup_compile"], 2) == 0.61 and facts["measurement"] == "confirmation"
    text = "\n".join(summary_lines(result, facts))
    assert "torch.compile of the reference is faster than this candidate (0.13 ms vs 0.213 ms)" in text
    assert "consider torch.compile" in text and "custom kernel" in text


def test_summary_labels_rewrites_and_warns_on_spread():
    result = _result(0.5, 66.9, "import torch\n")
    facts = search_facts(result)
    assert facts["custom_kernel"] is False and facts["label"] == REWRITE_LABEL and facts["noisy"]
    text = "\n".join(summary_lines(result, facts))
    assert REWRITE_LABEL in text and "not a custom kernel" in text
    assert "warning: the timing spread is 66.9%" in text
    assert "~2.00x (spread 67%: not reliable)" in text  # never a plain "2.00x"
    assert speedup_text(1.58, 3.0) == "1.58x ±3.0%"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "setting"])
def test_kernels_only_refuses_a_pytorch_rewrite(workspace, capsys, how):
    args = ["optimize", "rowloop_new.py", "--no-baselines", "--budget", "1", "--json"]
    if how == "flag":
        args.append("--kernels-only")
    else:
        (workspace / "pyproject.toml").write_text("[tool.kernel-lsp]\nkernels_only = true\n")
    server = start([f"one mv\n```python\n{MV}```\n"], default="")
    try:
        rc = main([*args, "--model", "m", "--base-url", server.base_url])
    finally:
        server.close()
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["improved"] is False and doc["best"] is None
    assert doc["reason"]  # says why nothing won
