"""The kept Worker (caller/keeper.py): a GPU Worker that outlives its Engine for an idle time and
serves the next Engine of the same configuration. Real keepers, real Workers (the stand-in run
module and no torch preload: they start in a fraction of a second), real sockets."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernel_lsp.engine import Engine
from kernel_lsp.engine.caller import keeper as keeping
from kernel_lsp.engine.caller.client import EngineTimeout, WorkerDied

FAKE = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run", "KERNEL_LSP_WORKER_PRELOAD": "",
        "KERNEL_LSP_WORKER_TEST_OPS": "tests.engine.worker_ops"}
ROOT = Path(__file__).resolve().parents[2]


def ours(folder: str) -> list[int]:
    """The keepers started for ``folder`` (their command line names its socket)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kernel_lsp.engine.caller.keeper" in cmd and folder.encode() in cmd:
            pids.append(int(entry))
    return pids


def end_keepers(folder: str) -> None:
    for pid in ours(folder):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def gone_soon(*pids: int | None, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(keeping._gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def keeper_dir(monkeypatch):
    # Short: a Unix socket's path must fit in 104 bytes.
    folder = tempfile.mkdtemp(prefix="klk-", dir="/tmp")
    monkeypatch.setenv(keeping.DIR_ENV, folder)
    yield folder
    end_keepers(folder)
    shutil.rmtree(folder, ignore_errors=True)


def session(keep: float | None = 30.0, env: dict | None = None, cwd: str | None = None, ops=("ping",),
            timeout: float = 20.0, **params) -> dict:
    """One Engine in its own event loop: its Worker's pings and how it was kept."""
    async def run() -> dict:
        async with Engine(timeout=timeout, warm=False, env={**FAKE, **(env or {})}, cwd=cwd,
                          keep_worker=keep) as e:
            out = {"answers": [await e.request(op, params) for op in ops]}
            out.update(pid=e.worker_pid, keeping=dict(e.worker_keeping or {}),
                       keeper_pid=getattr(e._worker, "keeper_pid", None), key=getattr(e._worker, "key", None))
            return out
    return asyncio.run(run())


def test_a_second_engine_reuses_the_kept_worker_and_the_socket_is_private(keeper_dir):
    first = session()
    assert first["keeping"]["kept"] is True and first["keeping"]["reused"] is False
    assert first["keeper_pid"] in ours(keeper_dir)
    second = session()
    assert second["keeping"] == {**second["keeping"], "kept": True, "reused": True, "idle_s": 30.0}
    assert second["pid"] == first["pid"] and second["keeper_pid"] == first["keeper_pid"]
    assert second["answers"][0]["requests"] > first["answers"][0]["requests"]

    # Another process, another event loop: the same Worker.
    code = ("import asyncio, json; from kernel_lsp.engine import Engine\n"
            "async def main():\n"
            f"    async with Engine(warm=False, env={FAKE!r}, keep_worker=30) as e:\n"
            "        p = await e.ping(); print(json.dumps([e.worker_pid, e.worker_keeping, p['requests']]))\n"
            "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr
    pid, kept, requests = json.loads(done.stdout.strip().splitlines()[-1])
    assert pid == first["pid"] and kept["reused"] is True and requests > second["answers"][0]["requests"]

    folder = Path(keeper_dir)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    sockets = list(folder.glob("*.sock"))
    assert len(sockets) == 1 and stat.S_ISSOCK(sockets[0].stat().st_mode)
    assert stat.S_IMODE(sockets[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(next(folder.glob("*.log")).stat().st_mode) == 0o600


def test_another_configuration_gets_another_worker(keeper_dir, tmp_path):
    base = session()
    other_env = session(env={"KERNEL_LSP_TEST_FLAVOUR": "other"})
    other_cwd = session(cwd=str(tmp_path))
    assert len({base["pid"], other_env["pid"], other_cwd["pid"]}) == 3
    assert len({base["key"], other_env["key"], other_cwd["key"]}) == 3
    assert not other_env["keeping"]["reused"] and not other_cwd["keeping"]["reused"]
    assert session()["pid"] == base["pid"]
    # Secret values never reach a Worker's environment, so never its name either.
    assert "other" not in "".join(p.name for p in Path(keeper_dir).iterdir())


def test_the_keeper_relays_an_evaluates_early_result_before_its_answer(keeper_dir, tmp_path):
    """A kept Worker's partial result (protocol.partial) reaches the Engine's `early` through the
    keeper, before the answer, in a first and in a reusing Engine."""
    from kernel_lsp.model import Candidate, Task

    task = Task(name="t", reference_path=str(tmp_path / "t.py"), reference_source="x = 1\n")
    cand = Candidate(source="def run():\n    return 3\n", kind="python")

    async def run() -> list:
        seen: list = []
        for _ in range(2):
            async with Engine(timeout=20, warm=False, env=FAKE, keep_worker=30, prebuild=False) as e:
                got: list = []
                ev = await e.evaluate(task, cand, early=got.append)
                seen.append((got, ev, e.worker_keeping["reused"]))
        return seen

    for got, ev, _ in asyncio.run(run()):
        assert [p.message for p in got] == ["early: 3"] and got[0].compiled_pending and got[0].compiled is None
        assert ev.message == "ran: 3" and not ev.compiled_pending and ev.compiled is not None
    assert [reused for *_, reused in asyncio.run(run())] == [True, True]


def test_the_language_servers_engine_keeps_nothing(keeper_dir):
    plain = session(keep=None)
    assert plain["keeping"] == {"kept": False, "reused": False, "idle_s": None}
    assert ours(keeper_dir) == [] and gone_soon(plain["pid"])


def test_a_timeout_kills_the_keeper_and_its_worker(keeper_dir):
    first = session()
    with pytest.raises(EngineTimeout):
        session(ops=("sleep",), timeout=1.0, seconds=30)
    assert gone_soon(first["keeper_pid"], first["pid"])
    again = session()
    assert again["keeping"]["reused"] is False and again["pid"] != first["pid"]


def test_a_worker_death_is_reported_with_its_stderr_and_never_reused(keeper_dir):
    first = session()
    with pytest.raises(WorkerDied) as died:
        session(ops=("crash",), how="abort")
    assert died.value.returncode == -signal.SIGABRT
    assert "Fatal Python error" in died.value.stderr_tail or "Aborted" in died.value.stderr_tail
    assert gone_soon(first["keeper_pid"], first["pid"])
    again = session()
    assert again["keeping"]["reused"] is False and again["pid"] != first["pid"]


def test_the_idle_time_ends_the_keeper_and_its_worker(keeper_dir):
    first = session(keep=1.0)
    assert first["keeping"]["idle_s"] == 1.0
    assert gone_soon(first["keeper_pid"], first["pid"], within=6.0)
    assert list(Path(keeper_dir).glob("*.sock")) == []


def test_a_stale_socket_is_replaced(keeper_dir):
    first = session()
    os.killpg(first["keeper_pid"], signal.SIGKILL)  # no clean-up: its socket file stays
    assert gone_soon(first["keeper_pid"], first["pid"])
    assert len(list(Path(keeper_dir).glob("*.sock"))) == 1
    again = session()
    assert again["keeping"]["kept"] is True and again["keeping"]["reused"] is False
    assert again["pid"] != first["pid"] and again["answers"][0]["pid"]


async def test_two_engines_at_once_never_share_a_worker(keeper_dir, monkeypatch):
    """One kept Worker allowed ($KERNEL_LSP_KEPT_WORKERS=1): the second command at once gets a
    fresh Worker that is not kept, and says why."""
    monkeypatch.setenv(keeping.KEPT_ENV, "1")
    async with Engine(timeout=20, warm=False, env=FAKE, keep_worker=30) as a:
        await a.ping()
        assert a.worker_keeping["kept"] is True
        async with Engine(timeout=20, warm=False, env=FAKE, keep_worker=30) as b:
            await b.ping()
            assert b.worker_keeping["kept"] is False and "in use" in b.worker_keeping["why"]
            assert b.worker_pid != a.worker_pid
            fresh = b.worker_pid
            both = await asyncio.gather(a.ping(), b.ping())
            assert all(p["requests"] >= 2 for p in both)
        assert gone_soon(fresh)  # the fresh one was not kept
        await a.ping()
    async with Engine(timeout=20, warm=False, env=FAKE, keep_worker=30) as c:
        await c.ping()
        assert c.worker_keeping["reused"] is True


async def test_commands_at_once_each_keep_a_worker_and_the_next_ones_reuse_them(keeper_dir, monkeypatch):
    """Three kept Workers allowed: three commands at once each start one (three keepers, three
    Workers), a fourth at once gets a fresh Worker that is not kept (all in use), and the next
    three at once reuse the three kept ones, each its own."""
    monkeypatch.setenv(keeping.KEPT_ENV, "3")

    async def together(n: int) -> list[dict]:
        engines = [Engine(timeout=20, warm=False, env=FAKE, keep_worker=30) for _ in range(n)]
        try:
            for e in engines:  # one after another, so that which one found what is fixed
                await e.ping()
            return [dict(e.worker_keeping or {}, pid=e.worker_pid) for e in engines]
        finally:
            for e in engines:
                await e.aclose()

    first = await together(4)
    assert [k["kept"] for k in first] == [True, True, True, False], first
    assert "all 3 kept Workers are in use" in first[3]["why"] and keeping.KEPT_ENV in first[3]["why"]
    assert not any(k["reused"] for k in first) and len({k["pid"] for k in first}) == 4
    assert len(ours(keeper_dir)) == 3 and len(list(Path(keeper_dir).glob("*.sock"))) == 3
    assert gone_soon(first[3]["pid"])
    again = await together(3)
    assert all(k["kept"] and k["reused"] for k in again), again
    assert {k["pid"] for k in again} == {k["pid"] for k in first[:3]}


def test_kept_workers_reads_the_environment(monkeypatch, caplog):
    monkeypatch.delenv(keeping.KEPT_ENV, raising=False)
    assert keeping.kept_workers() == keeping.DEFAULT_KEPT
    monkeypatch.setenv(keeping.KEPT_ENV, "2")
    assert keeping.kept_workers() == 2
    monkeypatch.setenv(keeping.KEPT_ENV, "0")
    assert keeping.kept_workers() == 1
    monkeypatch.setenv(keeping.KEPT_ENV, "many")
    assert keeping.kept_workers() == keeping.DEFAULT_KEPT and "not a whole number" in caplog.text


def test_keep_setting_reads_the_flag_then_the_environment(monkeypatch):
    monkeypatch.setenv(keeping.KEEP_ENV, "45")
    assert keeping.keep_setting(None) == 45.0 and keeping.keep_setting(0) == 0.0 and keeping.keep_setting(7) == 7.0
    monkeypatch.setenv(keeping.KEEP_ENV, "0")
    assert keeping.keep_setting(None) == 0.0
    monkeypatch.delenv(keeping.KEEP_ENV)
    assert keeping.keep_setting(None) == keeping.DEFAULT_IDLE_S
