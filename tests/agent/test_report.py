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
                          SearchOptions(budget=Budget(proposals=4, patience=None))).run()
    return store, result


async def test_report_page(tmp_path):
    store, result = await make_search(tmp_path)
    page = render_report(store, result.search_id)
    assert page.startswith("<!doctype html>") and "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<svg" in page and "<polyline" in page
    assert "improved: 2.50x faster" in page
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
    assert report_main(argparse.Namespace(search="999", out=None, root=str(tmp_path))) == 1
    assert report_main(argparse.Namespace(search=None, out=None, root=str(tmp_path / "nowhere"))) == 1
