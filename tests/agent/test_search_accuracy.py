"""The Search and accuracy (docs/correctness.md): a `less_accurate` candidate does not count
unless accept_less_accurate says so, and even then an accurate one is preferred."""

from kernel_lsp.agent.budget import Budget

from .test_search_policy import go


async def test_less_accurate_does_not_count_by_default_and_the_reason_says_how(tmp_path):
    result, *_ = await go(tmp_path, [["# ms: 4  tanh gelu\n# flags: less_accurate"]],
                          budget=Budget(proposals=1, patience=3))
    assert not result.improved and result.outcome == "no_improvement"
    assert "less_accurate" in result.reason and "accept_less_accurate = true" in result.reason
    result, *_ = await go(tmp_path / "b", [["# ms: 4  tanh gelu\n# flags: less_accurate"]],
                          budget=Budget(proposals=1, patience=3), accept_less_accurate=True)
    assert result.improved and result.speedup is not None and result.speedup > 2


async def test_the_search_prefers_an_accurate_candidate_to_a_faster_less_accurate_one(tmp_path):
    script = [["# ms: 3  approximate\n# flags: less_accurate", "# ms: 6  exact"]]
    result, *_ = await go(tmp_path, script, budget=Budget(proposals=2, patience=3), accept_less_accurate=True)
    assert result.improved and result.best is not None and "exact" in result.best.note
    ranking = result.to_dict()["ranking"]
    assert ranking[0]["winner"] and not ranking[0]["less_accurate"]
    assert [r["less_accurate"] for r in ranking].index(True) > 0
    # Without the accurate one, the less accurate one wins once accepted.
    result, *_ = await go(tmp_path / "b", [["# ms: 3  approximate\n# flags: less_accurate"]],
                          budget=Budget(proposals=1, patience=3), accept_less_accurate=True)
    assert result.improved and "approximate" in result.best.note


async def test_eval_only_never_counts_even_with_accept_less_accurate(tmp_path):
    result, *_ = await go(tmp_path, [["# ms: 4  drops bn\n# flags: eval_only"]],
                          budget=Budget(proposals=1, patience=3), accept_less_accurate=True)
    assert not result.improved and "eval_only" in result.reason
