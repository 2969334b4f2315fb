"""The float64 oracle and both modes on a CUDA GPU (the CPU half is test_accuracy.py).

Run on the device:  python -m pytest tests/engine/test_gpu_accuracy.py -m gpu -q
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.caller.tasks import find_task  # noqa: E402
from kernel_lsp.engine.worker.build import build  # noqa: E402
from kernel_lsp.engine.worker.judge import oracle  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.model import Evaluation  # noqa: E402

from .test_accuracy import NO_FLOAT64, SUITE, _load  # noqa: E402

pytestmark = pytest.mark.gpu


def on_cuda(name: str, **options: Any) -> Evaluation:
    task, cand = find_task(str(SUITE / f"{name}.py"))
    options.setdefault("baselines", False)
    options.setdefault("device", "cuda")
    return run.evaluate(task, cand, ["compile", "verify"], options, build)


@pytest.mark.parametrize("name", ["splitk_matmul", "tree_sum", "kahan_sum", "gemm_sum_rewrite", "layernorm_twopass",
                                  "gelu_tanh_for_erf", "layernorm_onepass", "kl_div_clamped", "softmax_small_wrong",
                                  "fp16_splitk_fp32acc", "bf16_gelu_fp32math", "fp32_task_in_bf16"])
def test_suite_outcomes_on_cuda(name: str) -> None:
    ev = on_cuda(name)
    expected = _load(name)["EXPECTED"]
    got = "less_accurate" if "less_accurate" in ev.flags else ev.verdict
    assert got == expected, (name, ev.verdict, ev.flags, (ev.accuracy or {}).get("ratio"), ev.message)
    acc = ev.accuracy or {}
    assert acc.get("rule") == "oracle" and (acc.get("oracle") or {}).get("available"), acc


def test_the_oracle_runs_on_the_gpu_and_is_cached() -> None:
    oracle.clear_cache()
    first = on_cuda("splitk_matmul")
    assert first.accuracy["oracle"]["runs"] >= 4
    second = on_cuda("splitk_matmul")
    assert second.accuracy["oracle"]["runs"] == 0 and second.accuracy["oracle"]["cached"] >= 4


def test_both_modes_on_cuda() -> None:
    ev = on_cuda("bn_train_dropped")
    assert ev.verdict == "correct" and "eval_only" in ev.flags, ev.message
    ev = on_cuda("bn_train_right")
    assert ev.verdict == "correct" and "eval_only" not in ev.flags, ev.message
    assert ev.accuracy["modes"]["train"].startswith("verified")
    ev = on_cuda("bn_eval_task")
    assert ev.verdict == "correct" and "eval_only" not in ev.flags
    ev = on_cuda("dropout_eval_only")
    assert ev.verdict == "correct" and ev.accuracy["modes"]["train"].startswith("not verified: random")


def test_float64_refused_on_cuda_falls_back_with_a_note() -> None:
    from kernel_lsp.model import Candidate, Task

    task = Task(name="no_f64_cuda", reference_path="/tmp/no_f64.py", reference_source=NO_FLOAT64)
    ev = run.evaluate(task, Candidate(source=NO_FLOAT64, kind="python"), ["compile", "verify"],
                      {"device": "cuda", "baselines": False}, build)
    assert ev.verdict == "correct" and ev.accuracy["rule"] == "fixed_tolerance"
    assert "does not run in float64" in " ".join(ev.evidence["notes"])
