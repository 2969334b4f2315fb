"""The Ray Executor against a real local Ray cluster on 127.0.0.1 (conftest.py): Searches on a
CPU task through GPU actors, an actor killed mid-Search, an actor that dies twice, builds
shared by content hash, no secret crossing. Candidates run in the actors' real Workers."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import pytest_asyncio

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.proposer import Proposal
from kernel_lsp.agent.search import Search, SearchOptions
from kernel_lsp.engine import find_task
from kernel_lsp.engine.caller.executor import open_executor
from kernel_lsp.model import Candidate
from kernel_lsp.store import Store
from tests.needs import needs_nvcc  # noqa: E402

from .conftest import GPU_KIND, NODE_SECRET

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tests" / "agent" / "tasks"
START_PATH = TASKS / "rowsum_new.py"
START_SRC = START_PATH.read_text()
LOOP = "        for i in range(x.shape[0]):\n            out[i] = torch.dot(x[i], ones)\n"
FASTER = START_SRC.replace(LOOP, "        out = torch.mv(x, ones)\n")
WRONG = START_SRC.replace(LOOP, "        out = torch.mv(x, ones) / x.shape[1]\n")
SLOWER = START_SRC.replace(LOOP, (
    "        for i in range(x.shape[0]):\n"
    "            out[i] = torch.dot(x[i], ones) + 0.0\n"))
# Slow to import (not to time): long enough to lose its actor mid-evaluation.
SLEEPY_FASTER = "import time\ntime.sleep(3)\n" + FASTER
SECRET = "sk-ray-driver-SECRET-1234"
OPTIONS = {"baselines": False, "bench_seconds": 0.3, "cache_probe": False}
statuses: list[dict] = []


class Scripted:
    """A Proposer that hands out fixed batches of whole files (the Proposer is not under test)."""

    name, model, can_repair, uses_profile = "scripted", None, False, False

    def __init__(self, *batches: list[tuple[str, str]]) -> None:
        self.batches = list(batches)
        self.counts: list[int] = []

    async def propose(self, request):
        self.counts.append(request.count)
        if not self.batches:
            return []
        return [Proposal(Candidate(source=src, kind="python", origin="llm", parent=request.parent.id, note=note))
                for note, src in self.batches.pop(0)]

    async def aclose(self) -> None:
        pass


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def executor(cluster):
    os.environ["OPENAI_API_KEY"] = SECRET  # in the driver's environment: must never cross
    ex = await open_executor("ray", ray_address=cluster.address, gpu=GPU_KIND, timeout=60, options=OPTIONS,
                             on_status=statuses.append)
    try:
        yield ex
    finally:
        os.environ.pop("OPENAI_API_KEY", None)
        await ex.aclose()


def search_for(ex, store, proposer, budget: int = 4) -> Search:
    task, start = find_task(str(START_PATH))
    return Search(ex, store, task, start, proposer,
                  SearchOptions(budget=Budget(proposals=budget, patience=3), profile=False))


async def wait_until(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_a_search_runs_on_the_gpu_actors_two_at_once(executor, tmp_path):
    assert executor.kind == "ray" and executor.concurrency == 2  # the node's two logical GPUs
    assert statuses and statuses[-1]["state"] == "connected" and statuses[-1]["gpus"] == 2
    store = Store(tmp_path / "store.sqlite")
    events = []
    proposer = Scripted([("slower", SLOWER), ("one mv", FASTER)], [("wrong", WRONG)])
    result = await search_for(executor, store, proposer).run(events.append)

    assert result.improved and result.best.source == FASTER, result.reason
    assert result.best_evaluation.verdict == "correct"
    assert proposer.counts[0] == 2  # the Search asked for as many children as the Executor runs at once
    # Both children of the first expansion were out at once: two "evaluating" before any "evaluated".
    kinds = [e.kind for e in events if e.kind in ("evaluating", "evaluated") and e.parent]
    assert kinds[:2] == ["evaluating", "evaluating"]
    # Every Evaluation says where it ran, in the store too.
    evs = store.evaluations(result.task)
    assert evs and all(ev.executor == "ray" and ev.node and "127.0.0.1" in ev.node for ev in evs)
    assert {ev.verdict for ev in evs} >= {"correct", "mismatch"}
    summary = evs[0].summary()
    assert summary["executor"] == "ray" and "127.0.0.1" in summary["node"]


async def test_an_actor_killed_mid_search_is_replaced_and_the_search_ends_right(executor, tmp_path):
    store = Store(tmp_path / "store.sqlite")
    killed: list[int] = []
    replaced0, retried0 = executor.replaced, executor.retried

    async def kill_busy() -> None:
        await wait_until(lambda: any(s.busy for s in executor._live()), 60, "a busy actor")
        await asyncio.sleep(1.0)  # inside the candidate's 3 s import
        for slot in executor._live():
            if slot.busy and slot.pid:
                os.kill(slot.pid, signal.SIGKILL)
                killed.append(slot.pid)

    killer: list[asyncio.Task] = []

    def progress(ev) -> None:
        if ev.kind == "evaluating" and ev.parent and not killer:
            killer.append(asyncio.ensure_future(kill_busy()))

    proposer = Scripted([("one mv, slow import", SLEEPY_FASTER), ("slower", SLOWER)])
    result = await search_for(executor, store, proposer, budget=2).run(progress)
    await killer[0]

    assert killed, "no actor was killed"
    assert result.improved and result.best.source == SLEEPY_FASTER, result.reason
    assert executor.replaced > replaced0 and executor.retried > retried0
    # The replacements come up: the executor is back to its two actors.
    await wait_until(lambda: len(executor._live()) == 2, 120, "replacement actors")
    assert all(s.pid not in killed for s in executor._live())


async def test_an_actor_that_dies_twice_is_crashed_with_its_node_named(executor):
    task, _ = find_task(str(START_PATH))
    kills: list[int] = []

    async def killer() -> None:
        while len(kills) < 2:
            busy = [s for s in executor._live() if s.busy and s.pid not in kills]
            if busy:
                await asyncio.sleep(0.8)
                if busy[0].alive and busy[0].busy:
                    os.kill(busy[0].pid, signal.SIGKILL)
                    kills.append(busy[0].pid)
            await asyncio.sleep(0.1)

    k = asyncio.ensure_future(killer())
    ev = await executor.evaluate(task, Candidate(SLEEPY_FASTER.replace("mv", "mv "), "python"), timeout=60)
    await asyncio.wait_for(k, 30)
    assert ev.verdict == "crashed" and ev.correct is None
    assert ev.executor == "ray" and ev.node and "127.0.0.1" in ev.node
    assert "twice" in ev.message and ev.message.count("127.0.0.1") >= 2, ev.message
    await wait_until(lambda: len(executor._live()) == 2, 120, "replacement actors")


HANG = START_SRC.replace("        ones = torch", "        while True:\n            pass\n        ones = torch")


async def test_a_hung_kernel_is_killed_at_its_deadline_and_the_actor_stays(executor):
    task, _ = find_task(str(START_PATH))
    pids = {s.pid for s in executor._live()}
    replaced = executor.replaced
    t0 = time.monotonic()
    ev = await executor.evaluate(task, Candidate(HANG, "python"), timeout=8)
    assert ev.verdict == "timeout" and ev.executor == "ray" and "127.0.0.1" in ev.node, ev.message
    assert time.monotonic() - t0 < 8 + 30  # the deadline, the Worker's restart, not the actor margin
    assert executor.replaced == replaced and {s.pid for s in executor._live()} == pids  # same actors
    ok = await executor.evaluate(task, Candidate(FASTER, "python"), timeout=60)
    assert ok.verdict == "correct"


ENV_PROBE = '''
import os
SUSPECT = ("KEY", "TOKEN", "SECRET", "AUTH", "PASSWORD", "OPENAI", "HF_")
names = sorted(k for k in os.environ if any(w in k.upper() for w in SUSPECT))
values = [k for k, v in os.environ.items() if "SECRET" in v]
raise RuntimeError(f"ENV-PROBE names={names} secret_values={values} count={len(os.environ)}")
'''


async def test_no_secret_crosses_to_the_cluster(executor, cluster):
    task, _ = find_task(str(START_PATH))
    ev = await executor.evaluate(task, Candidate(ENV_PROBE, "python"), timeout=60)
    assert "ENV-PROBE" in ev.message, ev.message
    assert "names=[]" in ev.message and "secret_values=[]" in ev.message, ev.message
    for secret in (SECRET, NODE_SECRET, cluster.token):
        assert secret not in ev.message
    assert ev.executor == "ray"


@needs_nvcc
async def test_a_build_runs_as_a_cluster_task_and_reaches_the_gpu_node_by_content_hash(executor, cluster):
    task, cand = find_task(str(REPO / "benchmarks" / "tasks" / "relu.cu"))
    assert cand is not None and cand.kind == "cuda"
    gpu_cache = cluster.root / "cache-gpus"
    before = set(gpu_cache.rglob("*.so")) if gpu_cache.exists() else set()
    result = await executor.prebuild(task, cand, options={"device": "cpu"})
    assert result.ok, result.log
    ev = await executor.evaluate(task, cand, checks=("compile",), options={"device": "cpu"}, timeout=120)
    assert ev.compile is not None and ev.compile.ok, ev.message
    # The GPU node's Worker found the library in its own cache: built elsewhere, shipped by hash.
    assert ev.compile.cached is True
    assert set(gpu_cache.rglob("*.so")) - before


async def test_build_workers_are_started_at_connect_and_stay_for_the_builds(executor, cluster):
    # One task per cluster CPU (the head's and the GPU node's), each in a Ray worker process that
    # is still alive afterwards, so the first builds of a session do not wait for Ray to start one.
    # (Two tasks may share one process when a build holds the other CPU meanwhile.)
    await wait_until(lambda: executor.warm_builders, 120, "the build workers warmed")
    pids = executor.warm_builders
    assert len(pids) == 2, pids
    assert os.getpid() not in pids
    for pid in pids:
        os.kill(pid, 0)  # raises if Ray ended the idle worker


async def test_the_local_executor_still_works_and_says_local():
    task, start = find_task(str(START_PATH))
    ex = await open_executor("local", timeout=60, options=OPTIONS)
    try:
        ev = await ex.evaluate(task, Candidate(FASTER, "python"), options={"device": "cpu"})
    finally:
        await ex.aclose()
    assert ev.verdict == "correct" and ev.executor == "local" and ev.node is None
    assert ex.status()["state"] == "connected" and ex.concurrency == 1
