"""The weak-test question ("would one input set's output pass for another's?") asked under the
rule that decides the verdict: the float64 oracle's scale-aware one, else the fixed tolerance.

On the H200, KernelBench's largest Softmax (4096 x 393,216: entries near 3e-6) was noted "the
reference gives the same output on every input set: the test is weak": every entry is below the
fixed atol of 1e-2, but the oracle that judged it would never accept one set's output for another.
"""

from __future__ import annotations

import torch

from kernel_lsp.engine.worker import run
from kernel_lsp.engine.worker.judge import verify
from kernel_lsp.model import Candidate, Task

CPU = torch.device("cpu")

WIDE_SOFTMAX = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(4, 65536)]


def get_init_inputs():
    return []
'''


def test_tiny_outputs_differ_on_their_own_scale_but_pass_the_fixed_tolerance() -> None:
    a = torch.softmax(torch.rand(4, 65536), dim=1)
    b = torch.softmax(torch.rand(4, 65536), dim=1)
    assert float((a - b).abs().max()) < 1e-4  # every difference below the fixed atol
    assert verify.same_output(a, b, CPU, relative=False, atol=None, rtol=None)
    assert not verify.same_output(a, b, CPU, relative=True, atol=None, rtol=None)


def test_a_constant_output_is_the_same_under_both_rules_and_structure_counts() -> None:
    one = torch.ones(16, 1)
    assert verify.same_output(one, one.clone(), CPU, relative=True, atol=None, rtol=None)
    assert verify.same_output((one, 3), (one.clone(), 3), CPU, relative=False, atol=None, rtol=None)
    assert not verify.same_output((one, 3), (one.clone(), 4), CPU, relative=True, atol=None, rtol=None)
    assert not verify.same_output(one, torch.ones(16, 2), CPU, relative=True, atol=None, rtol=None)
    # NaN where both are NaN is the same; a changed integer output is not.
    nan = torch.tensor([float("nan"), 1.0])
    assert verify.same_output(nan, nan.clone(), CPU, relative=True, atol=None, rtol=None)
    assert not verify.same_output(torch.arange(4), torch.arange(4) + 1, CPU, relative=True, atol=None, rtol=None)


def test_chunks_agree_with_one_pass(monkeypatch) -> None:
    a = torch.rand(1000) + 1.0
    b = a.clone()
    b[997] *= 1.5  # the last chunk differs
    monkeypatch.setattr(verify.accuracy, "CHUNK", 128)
    assert not verify.same_output(b, a, CPU, relative=True, atol=None, rtol=None)
    assert verify.same_output(a.clone(), a, CPU, relative=True, atol=None, rtol=None)


def _evaluate(options: dict) -> object:
    task = Task(name="wide_softmax", reference_path="/tmp/wide_softmax.py", reference_source=WIDE_SOFTMAX)
    cand = Candidate(source=WIDE_SOFTMAX.replace("class Model(", "class ModelNew("), kind="python")
    from kernel_lsp.engine.worker.build import build

    return run.evaluate(task, cand, ["verify"], {"device": "cpu", "baselines": False, **options}, build)


def test_a_wide_softmax_is_not_a_weak_test_under_the_oracle() -> None:
    ev = _evaluate({})
    assert ev.verdict == "correct", ev.message
    assert "near_constant_output" not in ev.flags
    assert not any("the test is weak" in n for n in (ev.evidence or {}).get("notes", [])), ev.evidence


def test_under_the_fixed_tolerance_the_same_softmax_is_a_weak_test() -> None:
    ev = _evaluate({"oracle": False})
    assert ev.verdict == "correct", ev.message
    assert "near_constant_output" in ev.flags
    assert any("the reference gives the same output on every input set" in n for n in (ev.evidence or {}).get("notes", [])), ev.evidence
