"""`kernel-lsp optimize` end to end, in process: the real Engine (CPU) and Store in a
temporary workspace; the LLM run goes through the real openai client to the scripted server."""

import argparse
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernel_lsp.cli.optimize import optimize_main, report_main
from kernel_lsp.store import Store

from .openai_server import start
from .test_search_e2e import FASTER, WRONG, fenced

pytestmark = pytest.mark.slow
TASKS = Path(__file__).parent / "tasks"
SECRET = "sk-cli-SECRET-5555"


def ns(target, **kw):
    base = dict(target=target, proposer=None, model=None, base_url=None, budget=4, timeout=60.0,
                apply=False, out=None, json=False, baselines=False)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for name in ("rowsum.py", "rowsum_new.py", "rowsum_chunk.py"):
        shutil.copy(TASKS / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_optimize_tuner_json_out_and_report(workspace, capsys):
    rc = optimize_main(ns("rowsum_chunk.py", proposer="tuner", json=True, out="best.py"))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    doc = json.loads(captured.out)  # stdout holds exactly one JSON document
    for key in ("improved", "speedup", "best", "candidates_evaluated", "tokens", "cost", "search"):
        assert key in doc
    assert doc["improved"] is True and doc["speedup"] > 1.5 and doc["tokens"] == 0
    assert (workspace / "best.py").read_text() == doc["best_source"]
    assert "CHUNK = 1\n" in (workspace / "rowsum_chunk.py").read_text()  # --out leaves the file alone
    assert report_main(argparse.Namespace(search=str(doc["search"]), out=None, root=".")) == 0
    page = Path(capsys.readouterr().out.strip()).read_text()
    assert "<svg" in page and "CHUNK 1 -&gt;" in page


def test_optimize_llm_apply_keeps_secret_out(workspace, capsys, monkeypatch):
    server = start([fenced("wrong", WRONG), fenced("one mv", FASTER)], default="")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    try:
        rc = optimize_main(ns("rowsum_new.py", model="gpt-4o-mini", budget=3, apply=True))
    finally:
        server.close()
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert (workspace / "rowsum_new.py").read_text() == FASTER  # applied: verified and faster
    assert "wrote the best candidate to rowsum_new.py" in captured.out
    assert SECRET not in captured.out + captured.err
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    stored = [f for f in (workspace / ".kernel-lsp").rglob("*") if f.is_file()]  # every file, at any depth
    assert any(f.suffix == ".sqlite" for f in stored), stored
    for f in stored:
        assert SECRET.encode() not in f.read_bytes(), f
    search = Store.for_workspace(workspace).searches()[0]
    assert search["state"] == "done" and search["budget"]["result"]["improved"] is True


def test_optimize_without_improvement_leaves_file(workspace, capsys, monkeypatch):
    server = start([fenced("wrong", WRONG)], default="no idea")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    before = (workspace / "rowsum_new.py").read_text()
    try:
        rc = optimize_main(ns("rowsum_new.py", proposer="llm", model="m", budget=2, apply=True, json=True))
    finally:
        server.close()
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["improved"] is False and doc["written"] is None  # ran, found nothing better
    # Says why, exactly: one wrong candidate (mismatch) and one lineage whose prose-only answer was
    # sent back to the model twice (docs/agent.md: parse_retries, 2) before it gave up.
    assert doc["outcome"] == "no_improvement" and "no candidate was correct (mismatch 1)" in doc["reason"], doc
    failed = doc["failed_steps"]
    evaluations = [s for s in failed if s["kind"] == "evaluation"]
    proposals = [s["reason"] for s in failed if s["kind"] == "proposal"]
    assert len(evaluations) == 1 and len(failed) == 4, failed
    assert evaluations[0]["verdict"] == "mismatch" and "against float64" in evaluations[0]["reason"]
    assert proposals == ["unusable answer, sent back to the model: no code block and no SEARCH/REPLACE patch "
                         "in the answer (prose only)"] * 2 + [
        "unusable answer: no code block and no SEARCH/REPLACE patch in the answer (prose only)"], proposals
    assert (workspace / "rowsum_new.py").read_text() == before


def test_optimize_bad_path(workspace, capsys):
    assert optimize_main(ns("missing.py")) == 2
    assert "no such file" in capsys.readouterr().err


def test_optimize_llm_seed_setting_and_flag(workspace, capsys, monkeypatch):
    """agent.seed / --seed reach the Search: on this CPU machine the production seed says in one
    line why there is none and the Search goes on; "none" asks for nothing; a bad value is bad input."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the production seed runs here (tests/agent/test_gpu.py covers it)")
    server = start([], default="no idea")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    try:
        rc = optimize_main(ns("rowsum_new.py", proposer="llm", model="m", budget=1))  # the default: inductor
        out = capsys.readouterr().out
        assert rc == 1 and "the torch.compile seed was not generated: no CUDA GPU is visible" in " ".join(out.split())
        (workspace / "pyproject.toml").write_text('[tool.kernel-lsp]\nagent_seed = "none"\n')
        rc = optimize_main(ns("rowsum_new.py", proposer="llm", model="m", budget=1, json=True))
        assert rc == 1 and json.loads(capsys.readouterr().out)["seed"] is None
        rc = optimize_main(ns("rowsum_new.py", proposer="llm", model="m", budget=1, json=True, seed="inductor"))
        doc = json.loads(capsys.readouterr().out)
        assert rc == 1 and doc["seed"]["status"] == "skipped" and "no CUDA GPU" in doc["seed"]["reason"]
        (workspace / "pyproject.toml").write_text('[tool.kernel-lsp]\nagent_seed = "yes"\n')
        rc = optimize_main(ns("rowsum_new.py", proposer="llm", model="m", budget=1))
        assert rc == 2 and "setting 'agent.seed' accepts none, inductor; got 'yes'" in capsys.readouterr().err
    finally:
        server.close()
