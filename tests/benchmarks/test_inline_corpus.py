"""The measurement scripts' own rules: which problem file a leaderboard solution belongs to, and
what the inline-build benchmark counts as a change the fast path made."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gather_inline_corpus as gather  # noqa: E402
import inline_build  # noqa: E402

PROBLEM = '''
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
def get_inputs():
    return [torch.randn(8, 4)]
def get_init_inputs():
    return [4, 5, 2.0]
'''


def solution(params: str) -> str:
    return f"class ModelNew(nn.Module):\n    def __init__(self{params}):\n        super().__init__()\n"


def test_a_solution_listed_as_problem_n_belongs_to_the_problem_file_n_plus_1():
    assert gather.problem_file(1, 22) == "docs/assets/problems/l1_p23.py"
    assert gather.problem_file(2, 0) == "docs/assets/problems/l2_p1.py"


@pytest.mark.parametrize("params, fits", [
    (", in_features, out_features, scale", True),
    (", a, b, c, d=1", True),
    (", *args", True),
    (", a, b, c, d, e, f, g, h, i", False),   # a level-2 solution of the next problem: 9 init arguments
    ("", False),
])
def test_the_pairing_check_binds_the_init_arguments(params, fits):
    why = gather.pairing_problems(solution(params), PROBLEM)
    assert (why == "") is fits, why
    if not fits:
        assert "init arguments, get_init_inputs gives 3" in why


def test_a_pair_without_the_contract_is_refused():
    assert gather.pairing_problems("x = 1\n", PROBLEM) == "the solution has no ModelNew"
    assert "no Model or get_inputs" in gather.pairing_problems(solution(""), "x = 1\n")


def _row(same_verdict, same_output, repeatable):
    return {"fast_path": True, "fast_s": 4.0, "default_s": 50.0, "same_verdict": same_verdict,
            "same_output": same_output, "default_repeatable": repeatable}


def test_only_differences_of_a_repeatable_default_build_count_as_changes():
    rows = [_row(True, True, True), _row(False, False, True), _row(False, False, False), _row(True, None, True)]
    s = inline_build.summarize(rows, ran=True)
    assert (s["verified"], s["verdict_changes"], s["output_changes"], s["not_repeatable"]) == (4, 1, 1, 1)


def test_outputs_compare_bit_for_bit_with_nan_where_nan(tmp_path):
    torch = pytest.importorskip("torch")
    a, b, c = (str(tmp_path / f"{n}.pt") for n in "abc")
    x = torch.tensor([1.0, float("nan"), 3.0])
    torch.save([x], a)
    torch.save([x.clone()], b)
    y = x.clone()
    y[2] = 3.0000002
    torch.save([y], c)
    assert inline_build.compare(a, b) == (True, "equal")
    same, why = inline_build.compare(a, c)
    assert same is False and why.startswith("max abs diff 2.38e-07")
    assert inline_build.compare(a, str(tmp_path / "missing.pt")) == (None, "no output")
