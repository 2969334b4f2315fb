import argparse
import re

from kernel_lsp.cli.optimize import report_main
from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.proposer import Proposal
from kernel_lsp.agent.report import render_report, speedup_series
from kernel_lsp.agent.search import Search, SearchOptions
from kernel_lsp.store import Store

from .fakes import FakeEngine
from .test_search_policy import START, TASK, Scripted


async def make_search(root):
    store = Store.for_workspace(root)
    proposer = Scripted([["# ms: 8 <b>first</b>", "# verdict: mismatch\n# ms: 1"],
                         [Proposal.failed("unusable answer: prose only")], ["# ms: 4"]])
    result = await Search(FakeEngine(), store, TASK, START, proposer,
                          SearchOptions(near_duplicates=False, budget=Budget(proposals=4, patience=None))).run()
    return store, result


async def test_report_page(tmp_path):
    store, result = await make_search(tmp_path)
    page = render_report(store, result.search_id)
    assert page.startswith("<!doctype html>") and "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<svg" in page and "<polyline" in page
    assert "improved: 2.50x \u00b10.5% faster than the start (confirmed by a re-run against the start)" in page
    assert "vs PyTorch eager: 2.50x" in page  # both baselines, from the start's first run
    assert "ran without a sandbox" in page  # the fake engine's Evaluations say sandboxed=False

    assert "&lt;b&gt;first&lt;/b&gt;" in page and "<b>first</b>" not in page  # notes are escaped
    assert '<span class="add">+# ms: 4</span>' in page  # the diff against its parent
    assert "unusable answer: prose only" in page
    assert page.count("<details") == 4  # root + 3 children
    assert "mismatch" in page


async def test_speedup_series_ignores_wrong_fast_candidates(tmp_path):
    store, result = await make_search(tmp_path)
    nodes = store.search(result.search_id)["nodes"]
    series = speedup_series(nodes, 10.0)
    assert [round(b, 2) for *_, b in series] == [1.0, 1.25, 1.25, 2.5]


async def test_report_cli(tmp_path, capsys):
    store, result = await make_search(tmp_path)
    out = tmp_path / "r.html"
    assert report_main(argparse.Namespace(search=None, out=str(out), root=str(tmp_path))) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert re.search(r"Search \d+: fake", out.read_text())
    # Nothing to render is input the command cannot use: exit 2, with the reason.
    assert report_main(argparse.Namespace(search="999", out=None, root=str(tmp_path))) == 2
    assert report_main(argparse.Namespace(search=None, out=None, root=str(tmp_path / "nowhere"))) == 2
    assert "no search 999" in capsys.readouterr().err


async def test_a_search_page_shows_only_its_own_measurements(tmp_path):
    # The same candidate, re-timed by a later Search at 1 ms, must not leak into the first page.
    store = Store.for_workspace(tmp_path)
    engine = FakeEngine()
    child = "# ms: 4\n# ms@3: 1\n# ms@4: 1\n"
    opts = SearchOptions(near_duplicates=False, budget=Budget(proposals=1, patience=None))
    first = await Search(engine, store, TASK, START, Scripted([[child]]), opts).run()
    assert first.best is not None and "# ms: 4" in first.best.source
    # The next Search starts from the winner and times it again (its 3rd and 4th runs: 1 ms).
    second = await Search(engine, store, TASK, first.best, Scripted([[]]), opts).run()
    page1, page2 = render_report(store, first.search_id), render_report(store, second.search_id)
    assert "4.0000 ms" in page1 and "1.0000 ms" not in page1 and "10.00x" not in page1
    assert "improved: 2.50x" in page1
    assert "start time</th><td>1.0000 ms" in page2 and "4.0000 ms" not in page2


async def test_headline_agrees_with_the_tree(tmp_path):
    # A fast candidate disqualified by its flags: "no improvement" at the top, and the tree
    # shows it as not counted (muted, with the flag), never as a green gain.
    store = Store.for_workspace(tmp_path)
    proposer = Scripted([["# ms: 0.05\n# flags: timer_patch,not_counted"]])
    result = await Search(FakeEngine(), store, TASK, START, proposer,
                          SearchOptions(near_duplicates=False, budget=Budget(proposals=1, patience=None))).run()
    assert not result.improved
    page = render_report(store, result.search_id)
    assert "no improvement" in page
    assert "1 candidate looked faster in a first run: 1 did not count" in page
    tree = page.split("<h2>Tree</h2>")[1].split("<h2>")[0]
    assert re.search(r'class="muted">correct ~?200\.00x[^<]*not counted \(timer_patch\)', tree), tree
    assert not re.search(r'class="ok">[^<]*200\.00x', tree)


async def test_pytorch_rewrite_is_labelled(tmp_path):
    store = Store.for_workspace(tmp_path)
    proposer = Scripted([["import torch\n# ms: 2\n# flags: torch_fallback"]])
    result = await Search(FakeEngine(), store, TASK, START, proposer,
                          SearchOptions(near_duplicates=False, budget=Budget(proposals=1, patience=None))).run()
    page = render_report(store, result.search_id)
    assert "PyTorch rewrite (no custom kernel)" in page.split("<h2>Tree</h2>")[1]
    # Rewrites count by default (kernels_only off): the headline says it is one.
    assert result.improved and result.custom_kernel is False, result.reason
    assert "faster than the start" in page and "PyTorch rewrite (no custom kernel)" in page.split("<table>")[0]


async def test_noisy_speedup_is_a_warning(tmp_path):
    store = Store.for_workspace(tmp_path)
    proposer = Scripted([["# ms: 5\n# spread: 40"]])
    result = await Search(FakeEngine(), store, TASK, START, proposer,
                          SearchOptions(near_duplicates=False, budget=Budget(proposals=1, patience=None), noise_factor=0.01)).run()
    page = render_report(store, result.search_id)
    assert "~2.00x (spread 40%: not reliable)" in page


async def test_a_search_that_could_not_run_says_so(tmp_path):
    store = Store.for_workspace(tmp_path)
    start = START.__class__(source="class ModelNew: ...\n# verdict: not_run\n", kind="python")
    result = await Search(FakeEngine(), store, TASK, start, Scripted([]),
                          SearchOptions(near_duplicates=False, budget=Budget(proposals=1, patience=None))).run()
    page = render_report(store, result.search_id)
    assert "could not run" in page and "no improvement" not in page.split("<table>")[0]
