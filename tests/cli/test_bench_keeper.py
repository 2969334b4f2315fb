"""`kernel-lsp bench` keeps its GPU Worker for the next command (caller/keeper.py): the second run
reuses it and says so in --json, --timings and on stderr; --keep-worker 0 keeps nothing. The real
CLI, the real Engine and Worker on the CPU."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernel_lsp.cli import main
from kernel_lsp.engine.caller import keeper as keeping
from tests.engine.test_keeper import end_keepers, gone_soon, ours

TASKS = Path(__file__).parent / "tasks"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for f in TASKS.glob("rowloop*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNEL_LSP_BASELINE_KEEP_SPREAD", "1000")
    folder = tempfile.mkdtemp(prefix="klk-", dir="/tmp")
    monkeypatch.setenv(keeping.DIR_ENV, folder)
    monkeypatch.setenv(keeping.KEEP_ENV, "60")  # tests/conftest.py turns keeping off for the rest
    yield folder
    end_keepers(folder)
    shutil.rmtree(folder, ignore_errors=True)


def bench(capsys, *flags: str) -> tuple[dict, str]:
    rc = main(["bench", "rowloop_new.py", "--json", *flags])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert rc == 0, doc
    return doc, captured.err


@pytest.mark.slow
def test_a_second_bench_reuses_the_kept_worker(workspace, capsys):
    first, err1 = bench(capsys)
    assert first["worker"]["kept"] is True and first["worker"]["reused"] is False
    assert first["worker"]["idle_s"] == 60
    assert "the GPU Worker stays for 60 s for the next run (--keep-worker 0 to stop it)" in err1
    keepers = ours(workspace)
    assert len(keepers) == 1

    second, err2 = bench(capsys, "--timings")
    assert second["worker"]["kept"] is True and second["worker"]["reused"] is True
    assert second["worker"]["pid"] == first["worker"]["pid"]
    assert "reused the kept GPU Worker" in err2
    phases = [p["phase"] for p in second["timings"]["phases"]]
    assert any(p.startswith(f"reusing the kept worker (pid {first['worker']['pid']}") for p in phases), phases
    assert "starting the Worker (spawn, torch import, CUDA init)" not in phases
    assert second["targets"][0]["verdict"] == "correct"

    # --keep-worker 0: a Worker of its own, ended with the command; the kept one is left alone.
    third, err3 = bench(capsys, "--keep-worker", "0")
    assert third["worker"] == {"kept": False, "reused": False, "idle_s": None}
    assert "stays for" not in err3
    assert ours(workspace) == keepers

    # --keep-worker 1: the newest command's idle time; the keeper then ends, and its Worker.
    fourth, _ = bench(capsys, "--keep-worker", "1")
    assert fourth["worker"]["reused"] is True and fourth["worker"]["idle_s"] == 1
    assert gone_soon(*keepers, fourth["worker"]["pid"], within=8.0)
