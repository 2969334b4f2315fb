import pytest

from kernel_lsp.agent.budget import Budget, Pricing
from kernel_lsp.agent.proposer import Proposal
from kernel_lsp.agent.search import Search, SearchOptions, noise_threshold
from kernel_lsp.model import Evaluation
from kernel_lsp.store import Store

from .fakes import FakeEngine, timing
from .test_search_policy import START, TASK, Scripted


def test_limits_and_reasons():
    b = Budget(proposals=None, tokens=1000, cost=0.5, seconds=None, patience=None)
    assert b.exhausted() is None
    b.charge(600, 300, 0.1)
    assert b.exhausted() is None and b.left()["tokens"] == 100
    b.charge(100, 0, 0.0)
    assert b.exhausted() == "token budget spent (1000/1000)"
    b = Budget(proposals=None, cost=0.5, patience=None)
    b.charge(0, 0, 0.5)
    assert b.exhausted().startswith("cost budget spent")
    b = Budget(proposals=None, seconds=0.0, patience=None)
    assert b.exhausted().startswith("time budget spent")
    assert Budget().usage()["tokens"] == 0


def test_noise_threshold():
    a = Evaluation(task="t", candidate="a", time=timing(10, spread=0.5))
    b = Evaluation(task="t", candidate="b", time=timing(5, spread=3.0))
    assert noise_threshold(a, b) == pytest.approx(1.06)
    assert noise_threshold(a, a) == pytest.approx(1.02)


async def test_cost_budget_stops_a_search(tmp_path):
    script = [[Proposal(candidate=None, error="unusable answer: empty answer", prompt_tokens=10**6,
                        completion_tokens=0, cost=Pricing().cost("gpt-4o", 10**6, 0))]] * 5
    result = await Search(FakeEngine(), Store(tmp_path / "s.sqlite"), TASK, START, Scripted(script),
                          SearchOptions(children=1, budget=Budget(proposals=None, cost=5.0, patience=None))).run()
    assert result.reason.startswith("cost budget spent") and result.usage["proposals"] == 2
    assert result.cost == pytest.approx(5.0)


async def test_repeated_transport_failures_stop(tmp_path):
    script = [[Proposal.failed("rate limited (HTTP 429): slow down (after 3 attempts)")]] * 10
    result = await Search(FakeEngine(), Store(tmp_path / "s.sqlite"), TASK, START, Scripted(script),
                          SearchOptions(children=1, budget=Budget(proposals=10, patience=None))).run()
    assert "3 proposer failures in a row" in result.reason and result.usage["proposals"] == 3
