"""The whole-model end-to-end result says what it holds: each replaced op with its own label
(issue 20, item 8: a block whose `act` got a custom kernel read "a PyTorch rewrite (no custom
kernel)" end to end). CPU, the real Engine: `act` replaced by a C kernel called through ctypes
(a custom kernel, built here with the system's C compiler), `norm` by a PyTorch rewrite."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.agent.integrate import Replacement, integrated_source  # noqa: E402
from kernel_lsp.agent.search import SearchResult  # noqa: E402
from kernel_lsp.agent.whole_model import OpResult, WholeModelOptions, _end_to_end, holds_label  # noqa: E402
from kernel_lsp.engine import Engine, find_task  # noqa: E402
from kernel_lsp.model import Candidate  # noqa: E402
from tests.agent.test_whole_model import NORM_FASTER  # noqa: E402

BLOCK = Path(__file__).parent / "tasks" / "block.py"
CC = shutil.which("cc") or shutil.which("gcc")

GELU_C = """#include <math.h>
void gelu(const float* x, float* y, long n) {
    for (long i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678f));
}
"""
ACT_KERNEL = '''import ctypes
import os

import torch
import torch.nn as nn

_LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gelu.so"))


class ModelNew(nn.Module):
    def forward(self, x0):
        x = x0.contiguous()
        y = torch.empty_like(x)
        _LIB.gelu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_long(x.numel()))
        return y
'''
NORM_REWRITE = NORM_FASTER  # the norm op rewritten in plain PyTorch
TENSOR = [{"tensor": {"shape": [96, 128], "dtype": "torch.float32", "device": "cpu"}}]


def op(name: str, kernel: Path, custom: bool) -> OpResult:
    best = Candidate(source=kernel.read_text(), kind="python")
    search = SearchResult(search_id=None, task=name, state="done", reason="", improved=True, start=best,
                          start_evaluation=None, best=best, best_evaluation=None, speedup=2.0, confirmed=True,
                          candidates_evaluated=1, usage={}, steps=[], ranking=[], custom_kernel=custom)
    return OpResult(name=name, cls=name, share=0.3, calls=1, shapes=[[96, 128]], search=search,
                    kernel=str(kernel), kept=True)


@pytest.mark.slow
@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_end_to_end_names_the_custom_kernel_and_the_rewrite(tmp_path):
    model = tmp_path / "block.py"
    shutil.copy(BLOCK, model)
    ops_dir = tmp_path / ".kernel-lsp" / "ops"
    ops_dir.mkdir(parents=True)
    (ops_dir / "gelu.c").write_text(GELU_C)
    subprocess.run([CC, "-O2", "-shared", "-fPIC", "-o", str(ops_dir / "gelu.so"), str(ops_dir / "gelu.c"), "-lm"],
                   check=True)
    act, norm = ops_dir / "block_act_new.py", ops_dir / "block_norm_new.py"
    act.write_text(ACT_KERNEL)
    norm.write_text(NORM_REWRITE)
    kept = [op("act", act, True), op("norm", norm, False)]
    assert [o.label for o in kept] == ["custom kernel", "PyTorch rewrite"]
    reps = [Replacement(op="act", kernel_path=str(act), init_inputs=[], args=TENSOR, label="custom kernel"),
            Replacement(op="norm", kernel_path=str(norm), init_inputs=[128], args=TENSOR, label="PyTorch rewrite")]
    source = integrated_source(str(model), str(tmp_path / "block_optimized.py"), reps)
    task, _ = find_task(str(model))
    opts = WholeModelOptions(end_to_end_options={"device": "cpu", "baselines": False, "bench_seconds": 0.2,
                                                 "cache_probe": False})  # the C kernel works on CPU tensors

    async def go():
        engine = Engine(timeout=300)
        try:
            plain = await engine.evaluate(task, Candidate(source=source, kind="python"),
                                          ("compile", "verify", "bench"), options=opts.end_to_end_options)
            ev, doc = await _end_to_end(engine, task, source, opts, [], kept)
            return plain, ev, doc
        finally:
            await engine.aclose()

    plain, ev, doc = asyncio.run(go())
    # What the engine alone says of the integrated file (it loads the kernels by path): the mislabel.
    assert plain.verdict == "correct" and plain.custom_kernel is False, plain.message
    assert plain.message.endswith("a PyTorch rewrite (no custom kernel)"), plain.message
    # What the end-to-end result says: each op with its own label.
    assert ev.verdict == "correct", ev.message
    assert doc["holds"] == {"custom_kernel": ["act"], "pytorch_rewrite": ["norm"]}
    assert doc["label"] == "custom kernel for act; PyTorch rewrite for norm"
    assert "no custom kernel" not in ev.message and ev.message.endswith(
        "the model holds: custom kernel for act; PyTorch rewrite for norm"), ev.message
    assert ev.custom_kernel is True and ev.label == "custom kernel"


def test_labels_of_each_mix():
    assert holds_label({"custom_kernel": ["a", "b"], "pytorch_rewrite": []}) == "custom kernels for a, b"
    assert holds_label({"custom_kernel": [], "pytorch_rewrite": ["attn"]}) == "PyTorch rewrite for attn"
    assert holds_label({"custom_kernel": [], "pytorch_rewrite": []}) == "no replacement"


def test_the_summary_and_the_report_show_what_the_model_holds(capsys, tmp_path):
    from kernel_lsp.cli.whole_model import _summary

    e2e = {"correct": True, "verdict": "correct", "bad_flags": [], "message": "correct", "speedup_eager": 1.36,
           "speedup_compile": 1.09, "spread_pct": 0.4, "needs": 1.02, "faster": True, "time_ms": 5.5,
           "eager_ms": 7.5, "compile_ms": 6.0, "holds": {"custom_kernel": ["mlp.act"], "pytorch_rewrite": ["attn"]},
           "label": "custom kernel for mlp.act; PyTorch rewrite for attn"}
    _summary({"model": "block.py", "device": "NVIDIA H200", "total_ms": 7.48, "ops": [], "end_to_end": e2e,
              "reason": "2 op(s) replaced"})
    out = capsys.readouterr().out
    assert "end to end: correct (custom kernel for mlp.act; PyTorch rewrite for attn), 1.36x eager" in out
    from kernel_lsp.agent.whole_model_report import render_whole_model
    from kernel_lsp.store import Store

    store = Store(tmp_path / "store.sqlite")
    root = Candidate(source="class Model: ...\n", kind="python", origin="reference")
    sid = store.start_search("block", root, "whole-model", {"whole_model": {
        "model": "block.py", "end_to_end": e2e, "ops": [], "reason": "2 op(s) replaced"}})
    page = render_whole_model(store, sid)
    assert "The model holds: custom kernel for mlp.act; PyTorch rewrite for attn" in page
