"""Accuracy against the float64 oracle (docs/correctness.md): the budget rule on the known-answer
suite (benchmarks/accuracy_suite/), less_accurate not counted unless accepted, an explicit
ATOL/RTOL winning, both modes (eval_only, MODE = "eval"), float64 refused with a note, the
oracle cached per Worker. CPU only; tests/engine/test_gpu_accuracy.py runs the same on CUDA."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.caller.tasks import TaskError, find_task  # noqa: E402
from kernel_lsp.engine.worker.judge import accuracy, modes, oracle  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.model import Candidate, Evaluation, Task  # noqa: E402
from kernel_lsp.verdicts import accuracy_phrase, evaluation_reason  # noqa: E402

from .test_cheats_cpu import _builder  # noqa: E402

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy_suite"


def _load(name: str) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    path = SUITE / f"{name}.py"
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def _suite_measure(name: str, sets: int = 2) -> accuracy.Measure:
    """The worst measure of a suite file's ModelNew, as the engine takes it (eval mode, same
    weights, the oracle a float64 copy of Model), without the rest of verify."""
    ns = _load(name)
    torch.manual_seed(42)
    init = ns["get_init_inputs"]()
    torch.manual_seed(42)
    ref = ns["Model"](*init).eval()
    cand = ns["ModelNew"](*init).eval()
    cand.load_state_dict(ref.state_dict(), strict=False)
    o64 = copy.deepcopy(ref).double()
    worst = None
    with torch.no_grad():
        for s in range(sets):
            torch.manual_seed(1000 + s)
            inputs = ns["get_inputs"]()
            m = accuracy.measure(cand(*inputs), ref(*inputs),
                                 o64(*[x.double() if x.is_floating_point() else x for x in inputs]))
            worst = accuracy.worse(worst, m)
    assert worst is not None
    return worst


def evaluate_file(name: str, task_kw: dict[str, Any] | None = None, **options: Any) -> Evaluation:
    task, cand = find_task(str(SUITE / f"{name}.py"))
    assert cand is not None
    for k, v in (task_kw or {}).items():
        setattr(task, k, v)
    options.setdefault("baselines", False)
    options.setdefault("device", "cpu")
    return run.evaluate(task, cand, ["compile", "verify"], options, _builder())


# -- the rule ----------------------------------------------------------------------------------------

# Every single-mode suite case whose measure decides it (the slow in-order matvec included: it
# is the issue's first example). The training-mode cases are below, through the engine.
RULE_CASES = ["gemm_sum_rewrite", "matvec_inorder", "splitk_matmul", "tree_sum", "kahan_sum", "gelu_tanh_for_erf",
              "layernorm_onepass", "layernorm_twopass", "kl_div_clamped", "softmax_small_wrong", "fp16_splitk_fp32acc",
              "bf16_gelu_fp32math", "fp32_task_in_fp16", "fp32_task_in_bf16"]


@pytest.mark.parametrize("name", RULE_CASES)
def test_the_budget_rule_gives_each_suite_case_its_known_answer(name: str) -> None:
    m = _suite_measure(name)
    assert m.outcome == _load(name)["EXPECTED"], (name, m.ratio, m.loose_ok)


def test_the_suite_cases_land_where_the_docs_say() -> None:
    """The measured ratios docs/correctness.md quotes (order of magnitude: they move with BLAS)."""
    assert _suite_measure("kahan_sum").ratio < 1.0            # more accurate than PyTorch
    assert _suite_measure("tree_sum").ratio < 3.0
    assert 100 < _suite_measure("gelu_tanh_for_erf").ratio < 1e4
    assert _suite_measure("kl_div_clamped").ratio > 1e4
    softmax = _suite_measure("softmax_small_wrong")
    assert softmax.ratio > 1e5


def test_at_most_the_reference_s_own_error_is_always_correct() -> None:
    torch.manual_seed(0)
    o64 = torch.randn(4096, dtype=torch.float64) * 3
    ref = (o64 + torch.randn_like(o64) * 1e-6).float()  # a reference with its own error
    for t in (0.0, 0.3, 1.0):
        out = (o64 + t * (ref.double() - o64)).float()
        assert accuracy.measure(out, ref, o64).outcome == "correct", t
    # An exact reference (a ReLU): one rounding of the output is still correct.
    exact = o64.float()
    assert accuracy.measure(exact.double().mul(1 + 2 ** -23).float(), exact, o64).outcome == "correct"


def test_a_thousand_times_the_reference_s_error_is_never_plainly_correct() -> None:
    torch.manual_seed(0)
    o64 = torch.randn(4096, dtype=torch.float64)
    ref = (o64 + torch.randn_like(o64) * 1e-6).float()
    out = (o64 + 1000 * (ref.double() - o64)).float()
    m = accuracy.measure(out, ref, o64)
    assert m.ratio > 900 and m.outcome == "less_accurate"
    far = (o64 + 1e5 * (ref.double() - o64)).float()
    assert accuracy.measure(far, ref, o64).outcome == "mismatch"


def test_within_1e_2_alone_is_not_enough() -> None:
    """KernelBench's older 1e-2 accepts the softmax twice wrong on small entries; the ratio caps it."""
    ns = _load("softmax_small_wrong")
    torch.manual_seed(1)
    x = ns["get_inputs"]()[0]
    ref, out = ns["Model"]()(x), ns["ModelNew"]()(x)
    assert torch.allclose(out, ref, atol=1e-2, rtol=1e-2)
    assert accuracy.measure(out, ref, torch.softmax(x.double(), dim=1)).outcome == "mismatch"


# -- through the engine --------------------------------------------------------------------------

def test_less_accurate_is_correct_flagged_and_not_counted() -> None:
    ev = evaluate_file("gelu_tanh_for_erf")
    assert ev.verdict == "correct" and ev.correct is True, ev.message
    assert "less_accurate" in ev.flags and "not_counted" in ev.flags
    acc = ev.accuracy
    assert acc is not None and acc["rule"] == "oracle" and acc["outcome"] == "less_accurate"
    assert acc["ratio"] > accuracy.RATIO_CORRECT and acc["budget"] == pytest.approx(acc["ratio_correct"] * max(
        acc["ref_err"], accuracy.eps(torch.float32)))
    assert "PyTorch's error against float64" in ev.message
    reason = evaluation_reason(ev)
    assert "not counted (less_accurate)" in reason and "beyond the 100x budget" in reason
    # The setting counts it (the engine adds no not_counted), and the reason says so.
    ev = evaluate_file("gelu_tanh_for_erf", accept_less_accurate=True)
    assert "less_accurate" in ev.flags and "not_counted" not in ev.flags
    assert "not counted" not in evaluation_reason(ev, accept_less_accurate=True)


def test_mismatch_evidence_carries_the_ratio_and_the_worst_element() -> None:
    ev = evaluate_file("softmax_small_wrong")
    assert ev.verdict == "mismatch", ev.message
    e = ev.evidence or {}
    # Within 1e-2 everywhere: only the ratio cap refuses it.
    assert e["rule"] == "oracle" and e["ratio"] > 1e5 and e["within_loose"] is True
    assert len(e["where"]) == 2 and e["got"] == pytest.approx(2 * e["oracle"], rel=1e-3)
    assert "the reference's own error against float64" in ev.message
    # KernelBench's older fixed 1e-2, given as options, accepts it (and says whose rule it was).
    ev = evaluate_file("softmax_small_wrong", atol=1e-2, rtol=1e-2)
    assert ev.verdict == "correct" and "the options' ATOL=0.01" in ev.accuracy["rule_text"]


def test_a_split_k_gemm_the_fixed_rule_rejected_is_correct() -> None:
    """Issue 20's first failure: a correct reordering judged against the fp32 reference's own
    rounding. The fixed 1e-4 rejects the split-K GEMM on an output near zero; the budget sees
    it is as close to float64 as PyTorch is."""
    old = evaluate_file("splitk_matmul", oracle=False)
    assert old.verdict == "mismatch" and old.evidence["atol"] == 1e-4, old.message
    new = evaluate_file("splitk_matmul")
    assert new.verdict == "correct" and new.accuracy["ratio"] < 3, new.message


def test_an_explicit_tolerance_wins_and_says_so() -> None:
    # The tanh GELU is within 1e-3 absolute: the Task's ATOL decides, no less_accurate flag.
    ev = evaluate_file("gelu_tanh_for_erf", task_kw={"atol": 1e-3, "rtol": 0.0})
    assert ev.verdict == "correct" and "less_accurate" not in ev.flags, ev.message
    acc = ev.accuracy
    assert acc["rule"] == "task_tolerance" and "the Task's ATOL=0.001" in acc["rule_text"]
    assert acc["ratio"] > accuracy.RATIO_CORRECT  # still measured and shown
    assert any("the Task's ATOL=0.001" in n for n in ev.evidence["notes"])
    # And it wins the other way: the softmax wrong on small entries passes a Task's 1e-2.
    ev = evaluate_file("softmax_small_wrong", task_kw={"atol": 1e-2, "rtol": 1e-2})
    assert ev.verdict == "correct" and ev.accuracy["rule"] == "task_tolerance"


# -- both modes ---------------------------------------------------------------------------------------

def test_a_candidate_that_drops_batchnorm_in_training_mode_is_eval_only() -> None:
    ev = evaluate_file("bn_train_dropped")
    assert ev.verdict == "correct" and "eval_only" in ev.flags and "not_counted" in ev.flags, ev.message
    notes = " ".join(ev.evidence["notes"])
    assert "correct in eval mode only" in notes and "bn (BatchNorm1d)" in notes
    assert ev.accuracy["modes"]["train"].startswith("wrong")
    assert ev.accuracy["train_evidence"]["mode"] == "train"
    assert "not counted (eval_only)" in evaluation_reason(ev)


def test_mode_eval_in_the_task_verifies_eval_mode_only() -> None:
    ev = evaluate_file("bn_eval_task")
    assert ev.verdict == "correct" and "eval_only" not in ev.flags, ev.message
    assert ev.accuracy["modes"]["train"].startswith('not verified: the Task declares MODE = "eval"')
    # The same candidate file without the declaration is eval_only (the Task's mode decides).
    ev = evaluate_file("bn_eval_task", task_kw={"mode": None})
    assert "eval_only" in ev.flags


def test_a_candidate_right_in_both_modes_is_correct_and_verified_in_both() -> None:
    ev = evaluate_file("bn_train_right")
    assert ev.verdict == "correct" and "eval_only" not in ev.flags, ev.message
    assert ev.accuracy["modes"]["train"].startswith("verified")
    assert any("verified in training and eval mode" in n for n in ev.evidence["notes"])


def test_dropout_is_verified_in_eval_mode_only_and_says_so() -> None:
    ev = evaluate_file("dropout_eval_only")
    assert ev.verdict == "correct" and "eval_only" not in ev.flags, ev.message
    assert any("random in training mode (Dropout): verified in eval mode only" in n for n in ev.evidence["notes"])


def test_the_mode_probe_puts_running_statistics_back() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pr = modes.probe(model, [torch.randn(16, 8) + 3], 42, lambda m, x: m(*x))
    assert pr.dependent and not pr.random_in_training and pr.modules == ["1 (BatchNorm1d)"]
    assert not model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # Without States.restore the same calls would have moved them: the check can fail.
    model.train()
    model(torch.randn(16, 8) + 3)
    assert not torch.equal(model.state_dict()["1.running_mean"], before["1.running_mean"])


def test_mode_is_read_from_the_reference(tmp_path: Path) -> None:
    src = (SUITE / "bn_eval_task.py").read_text()
    (tmp_path / "t.py").write_text(src)
    task, _ = find_task(str(tmp_path / "t.py"))
    assert task.mode == "eval"
    (tmp_path / "u.py").write_text(src.replace('MODE = "eval"', 'MODE = "training"'))
    with pytest.raises(TaskError, match='MODE must be "eval"'):
        find_task(str(tmp_path / "u.py"))


# -- the oracle itself ------------------------------------------------------------------------------

NO_FLOAT64 = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        if x.dtype == torch.float64:  # as an op with no float64 kernel (some CUDA half ops) does
            raise RuntimeError('"gelu_cuda" not implemented for \\'Double\\'')
        return torch.nn.functional.gelu(x) * 2


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x) * 2


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

CASTS_DOWN = NO_FLOAT64.replace('''        if x.dtype == torch.float64:  # as an op with no float64 kernel (some CUDA half ops) does
            raise RuntimeError('"gelu_cuda" not implemented for \\'Double\\'')
        return torch.nn.functional.gelu(x) * 2''', '''        return torch.nn.functional.gelu(x.float()) * 2''')


def _inline(source: str, **options: Any) -> Evaluation:
    task = Task(name=f"inline_{abs(hash(source))}", reference_path="/tmp/inline_ref.py", reference_source=source)
    options.setdefault("baselines", False)
    options.setdefault("device", "cpu")
    return run.evaluate(task, Candidate(source=source, kind="python"), ["compile", "verify"], options, _builder())


def test_float64_unavailable_falls_back_to_the_fixed_tolerance_with_a_note() -> None:
    ev = _inline(NO_FLOAT64)
    assert ev.verdict == "correct", ev.message
    assert ev.accuracy["rule"] == "fixed_tolerance" and ev.accuracy["oracle"]["available"] is False
    notes = " ".join(ev.evidence["notes"])
    assert "does not run in float64 (RuntimeError" in notes and "fixed tolerance used" in notes
    assert ev.accuracy["fp32_atol"] == 1e-4
    ev = _inline(CASTS_DOWN)
    assert ev.verdict == "correct" and ev.accuracy["rule"] == "fixed_tolerance"
    assert "still computed in lower precision (aten.gelu" in " ".join(ev.evidence["notes"])


def test_the_oracle_is_cached_per_worker_and_a_second_evaluation_pays_nothing() -> None:
    oracle.clear_cache()
    first = evaluate_file("tree_sum")
    o1 = first.accuracy["oracle"]
    assert o1["runs"] >= 4 and o1["seconds"] > 0 and oracle.cache_size() >= 4
    second = evaluate_file("tree_sum")
    o2 = second.accuracy["oracle"]
    assert o2["runs"] == 0 and o2["seconds"] == 0 and o2["cached"] >= 4
    assert second.accuracy["ratio"] == pytest.approx(first.accuracy["ratio"])
    # Another Task (another reference text) is not served from it.
    third = evaluate_file("kahan_sum")
    assert third.accuracy["oracle"]["runs"] >= 4


def test_accuracy_round_trips_through_the_store(tmp_path: Path) -> None:
    from kernel_lsp.store import Store

    ev = evaluate_file("gelu_tanh_for_erf")
    store = Store(tmp_path / "s.sqlite")
    task, cand = find_task(str(SUITE / "gelu_tanh_for_erf.py"))
    store.record(task, cand, ev)
    back = store.evaluations(task.name, limit=1)[0]
    assert back.accuracy == ev.accuracy and back.summary()["accuracy"] == ev.accuracy
    assert "less_accurate" in back.flags


def test_accuracy_in_words() -> None:
    assert accuracy_phrase(None) is None
    assert accuracy_phrase({"rule": "oracle", "ratio": 3.14, "ratio_correct": 100.0, "outcome": "correct"}) == \
        "3.1x PyTorch's error against float64 (correct up to 100x)"
    assert accuracy_phrase({"rule": "fixed_tolerance", "rule_text": "no oracle"}) == "no oracle"


# -- chunks --------------------------------------------------------------------------------------------

def _measures(monkeypatch: pytest.MonkeyPatch, chunk: int) -> accuracy.Measure:
    monkeypatch.setattr(accuracy, "CHUNK", chunk)
    monkeypatch.setattr(accuracy, "HOST_CHUNK", chunk)
    torch.manual_seed(0)
    x = torch.rand(37, 53, dtype=torch.float64)
    o64 = torch.softmax(x, 1)
    ref = o64.float()
    cand = ref.clone()
    cand[20, 7] += 1e-3  # one element off: its place and the count beyond the budget must not depend on chunks
    return accuracy.measure(cand, ref, o64)


def test_a_measure_by_chunks_finds_the_same_worst_element_as_in_one_piece(monkeypatch) -> None:
    whole = _measures(monkeypatch, 1 << 25)
    for chunk in (7, 64, 1000):
        m = _measures(monkeypatch, chunk)
        assert (m.where, m.outcome, m.beyond) == (whole.where, whole.outcome, whole.beyond) == ([20, 7], "mismatch", 1)
        assert m.cand_err == pytest.approx(whole.cand_err) and m.scale == pytest.approx(whole.scale)


def test_host_chunks_are_small_and_gpu_chunks_large() -> None:
    # 16 MiB float64 temporaries on the host (the heap reuses them), 256 MiB on a GPU.
    assert accuracy.chunk_size(torch.device("cpu")) * 8 == 16 << 20
    assert accuracy.chunk_size(torch.device("cuda", 0)) * 8 == 256 << 20


def test_a_gpu_without_a_chunk_s_room_measures_on_the_host(monkeypatch) -> None:
    # The oracle sits on the host for the largest Tasks and the chunks go to the candidate's GPU;
    # when even a chunk does not fit there, the measure runs on the host, same answer.
    tried: list[str] = []
    real = accuracy._Scan.__init__

    def scan(self, of, ef, rf, dev):  # type: ignore[no-untyped-def]
        tried.append(dev.type)
        if dev.type != "cpu":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")
        real(self, of, ef, rf, dev)

    monkeypatch.setattr(accuracy._Scan, "__init__", scan)
    monkeypatch.setattr(accuracy, "compute_device", lambda *t: torch.device("cuda", 0))
    m = _measures(monkeypatch, 1 << 25)
    assert tried == ["cuda", "cpu"] and m.where == [20, 7] and m.outcome == "mismatch"
