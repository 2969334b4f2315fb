"""A process waiting for the GPU says what its evaluation needs there (its Task sized on the meta
device, worker/judge/memory_plan.turn_need), so that a holder with much live data at a turn point
still lets a small Task in (caller/gpu_lock.may_hand_over). Six benches at once on an H200: the
6 GiB softmax held the GPU through its whole evaluation and three 64 MiB Tasks waited 143-152 s
behind it. Real Workers and real processes; the GPU key is set by hand (no GPU here)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from kernel_lsp.engine.caller import gpu_lock
from kernel_lsp.engine.worker.judge import memory_plan
from kernel_lsp.model import Task

from tests.engine.test_gpu_lock import LARGE_S
from tests.engine.test_gpu_turns import _env

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
H100 = 80 * GIB

# Queues for the GPU argv[1] saying it needs argv[2] bytes ("" for unsaid), prints "held" once it
# has the turn, then lets it go.
NEEDS = """
import asyncio, sys
from kernel_lsp.engine.caller import gpu_lock

async def main():
    need = int(sys.argv[2]) if sys.argv[2] else None
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate", needs_bytes=need):
        print("held", flush=True)

asyncio.run(main())
"""

SOFTMAX = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(features))

    def forward(self, x):
        return torch.softmax(x * self.scale, dim=-1)


def get_inputs():
    return [torch.rand(4096, 16384)]


def get_init_inputs():
    return [16384]
'''


def needs_later(key: str, need: int | None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", NEEDS, key, "" if need is None else str(need)], env=_env(),
                            stdout=subprocess.PIPE, text=True)


async def queued(turn: gpu_lock.Turn) -> list[dict]:
    for _ in range(200):
        waiting = turn.others_waiting()
        if waiting:
            return waiting
        await asyncio.sleep(0.05)
    raise AssertionError("the waiter never queued")


def test_a_tasks_need_counts_its_working_set_kept_sets_oracle_and_context():
    mib = 1 << 20
    # A 64 MiB Task (KernelBench's medium level-1 sizes): working 448 MiB, 4 kept sets of 128 MiB,
    # a float64 oracle of 480 MiB, the context's GiB.
    assert memory_plan.turn_need(64 * mib, 64 * mib, 0) == int(448 * mib + 512 * mib + 480 * mib + GIB)
    # Parameters count twice (the reference's Model and the candidate's) and in the oracle.
    assert memory_plan.turn_need(64 * mib, 64 * mib, 8 * mib) - memory_plan.turn_need(64 * mib, 64 * mib, 0) \
        == int(16 * mib + 2.5 * 8 * mib)
    # The 6 GiB softmax needs more than 3/4 of any card: nobody holding much hands it the turn.
    assert memory_plan.turn_need(6 * GIB, 6 * GIB, 0) > gpu_lock.HAND_OVER_MAX_SHARED * 141 * GIB


def test_a_holder_above_the_eighth_lets_in_only_waiters_whose_need_fits():
    # 22 GiB live (a 6 GiB softmax at a verify turn point) on an 80 GB H100.
    assert not gpu_lock.may_hand_over(22 * GIB, H100)
    assert not gpu_lock.may_hand_over(22 * GIB, H100, needs=[None])  # unsaid: the 1/8 rule
    assert not gpu_lock.may_hand_over(22 * GIB, H100, needs=[2 * GIB, None])  # every one ahead must say
    assert gpu_lock.may_hand_over(22 * GIB, H100, needs=[2 * GIB, 3 * GIB])
    assert not gpu_lock.may_hand_over(22 * GIB, H100, needs=[2 * GIB, 40 * GIB])  # 62 > 60 GiB
    assert not gpu_lock.may_hand_over(22 * GIB, H100, paused_bytes=20 * GIB, needs=[20 * GIB])
    assert gpu_lock.may_hand_over(4 * GIB, H100, needs=[None])  # below the eighth, as before
    assert not gpu_lock.may_hand_over(22 * GIB, H100, needs=[-1])


def test_a_waiter_publishes_its_need_and_busy_says_when_a_new_evaluation_will_queue(lock_dir):
    assert not gpu_lock.busy("GPU-need")  # no lock file yet

    async def go():
        async with gpu_lock.gpu_turn("GPU-need", "evaluate", expect_s=LARGE_S) as turn:
            assert gpu_lock.busy("GPU-need")  # held
            waiter = needs_later("GPU-need", 3 * GIB)
            waiting = await queued(turn)
            assert gpu_lock.needs_of(waiting) == [3 * GIB]
            assert gpu_lock.needs_of(turn.others_ahead()) == [3 * GIB]  # (its target comes first)
            unsaid = needs_later("GPU-need", None)
            while len(turn.others_waiting()) < 2:
                await asyncio.sleep(0.05)
            assert gpu_lock.needs_of(turn.others_waiting()) == [3 * GIB, None]
        for proc in (waiter, unsaid):
            assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
            assert proc.wait(20) == 0

    asyncio.run(go())
    assert not gpu_lock.busy("GPU-need")  # let go, nobody waits


def test_a_holder_with_22_gib_live_hands_over_to_a_small_task_that_said_its_need(lock_dir):
    """The turn point of a large evaluation: kept for a waiter whose need is unknown (as before),
    handed over to one that said it needs 2.4 GiB (22 + 2.4 GiB within 3/4 of the card)."""
    from kernel_lsp.engine import Engine
    from kernel_lsp.engine.caller.client import _Deadline

    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    async def go():
        engine = Engine(timeout=60, options={"device": "cpu"})
        point = {"stage": "verify_set", "turn": 1, "held_bytes": 22 * GIB, "total_bytes": H100}
        async with gpu_lock.gpu_turn("GPU-big", "evaluate", expect_s=LARGE_S) as turn:
            unsaid = needs_later("GPU-big", None)
            await queued(turn)
            await engine._hand_over(turn, point, release, _Deadline(60), None, None)
            assert unsaid.poll() is None and not released and turn.handovers == 0  # kept
        assert unsaid.stdout is not None and unsaid.stdout.readline().strip() == "held"
        assert unsaid.wait(20) == 0
        async with gpu_lock.gpu_turn("GPU-big", "evaluate", expect_s=LARGE_S) as turn:
            said = needs_later("GPU-big", memory_plan.turn_need(64 << 20, 64 << 20, 0))
            await queued(turn)
            await engine._hand_over(turn, {**point, "turn": 2}, release, _Deadline(60), None, None)
            assert turn.handovers == 1 and released == [True]  # handed over, and taken back
        assert said.stdout is not None and said.stdout.readline().strip() == "held"
        assert said.wait(20) == 0

    asyncio.run(go())


def test_the_worker_sizes_a_task_on_meta_without_drawing_it(tmp_path):
    """The real Worker's task_need: a 256 MiB input set, its 256 MiB output (the forward ran on
    meta), the 64 KiB parameter; no tensor drawn (a 256 MiB torch.rand on this CPU takes ~0.4 s).
    A get_inputs that reads a value (`.item()`) cannot run on meta: not sized, and said."""
    from kernel_lsp.engine import Engine

    task = Task(name="softmax", reference_path=str(tmp_path / "softmax.py"), reference_source=SOFTMAX)
    odd = Task(name="odd", reference_path=str(tmp_path / "odd.py"),
               reference_source=SOFTMAX.replace("torch.rand(4096, 16384)", "torch.rand(4096, 16384) * torch.rand(1).item()"))

    async def go():
        engine = Engine(timeout=60, sandbox="off", warm=False)
        try:
            await engine.ping()
            t0 = time.monotonic()
            got = await engine.request("task_need", {"task": task.to_dict(), "options": {"device": "cuda"}})
            took = time.monotonic() - t0
            on_cpu = await engine.request("task_need", {"task": task.to_dict(), "options": {"device": "cpu"}})
            unknown = await engine.request("task_need", {"task": odd.to_dict(), "options": {"device": "cuda"}})
            return got, took, on_cpu, unknown
        finally:
            await engine.aclose()

    got, took, on_cpu, unknown = asyncio.run(go())
    assert got["input_bytes"] == got["output_bytes"] == 256 << 20 and got["output_known"] is True
    assert got["param_bytes"] == 16384 * 4
    assert got["need_bytes"] == memory_plan.turn_need(256 << 20, 256 << 20, 16384 * 4)
    assert took < 5.0, took
    assert on_cpu == {"why": "not a GPU Task"}
    assert unknown == {"why": "get_inputs() does not run on the meta device"}


def test_an_engine_says_its_need_only_when_it_will_queue(tmp_path, lock_dir):
    """Alone on the GPU the Worker is not asked (nobody would read it); behind a holder, the
    waiter's file carries the need, asked once per reference."""
    from kernel_lsp.engine import Engine

    task = Task(name="softmax", reference_path=str(tmp_path / "softmax.py"), reference_source=SOFTMAX)
    params = {"task": task.to_dict(), "options": {"device": "cuda"}}

    async def go():
        engine = Engine(timeout=60, sandbox="off", warm=False)
        try:
            await engine.ping()
            w = await engine._ensure(None, False)
            alone = await engine._task_need(w, params, "GPU-said")
            async with gpu_lock.gpu_turn("GPU-said", "evaluate"):
                behind = await engine._task_need(w, params, "GPU-said")
            requests = (await engine.ping())["requests"]
            again = await engine._task_need(w, params, "GPU-said")  # kept: the Worker is not asked again
            return alone, behind, again, requests, (await engine.ping())["requests"]
        finally:
            await engine.aclose()

    alone, behind, again, requests, later = asyncio.run(go())
    assert alone == (None, None)
    # What it needs, and its data (one input set and its output) for its expected GPU work.
    assert behind == again == (memory_plan.turn_need(256 << 20, 256 << 20, 16384 * 4), 512 << 20)
    assert later == requests + 1  # only the ping


def test_a_waiters_file_says_nothing_of_an_unknown_need(lock_dir):
    w = gpu_lock._Waiter("GPU-file", "evaluate", needs_bytes=None)
    s = gpu_lock._Waiter("GPU-file", "evaluate", needs_bytes=5)
    try:
        assert "needs_bytes" not in json.loads(Path(w.path).read_text())
        assert json.loads(Path(s.path).read_text())["needs_bytes"] == 5
    finally:
        w.remove()
        s.remove()


def test_an_evaluation_that_hands_over_says_its_need_again_as_it_queues_to_get_the_turn_back(lock_dir, monkeypatch):
    """Unsaid on the way back, it would wait behind a holder above the eighth for that holder's
    whole evaluation: the very wait the need is said to avoid."""
    said: list[int | None] = []
    real = gpu_lock._Waiter

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, key, what, place_ns=None, needs_bytes=None):
            super().__init__(key, what, place_ns, needs_bytes)
            said.append(needs_bytes)

    monkeypatch.setattr(gpu_lock, "_Waiter", Recorded)

    async def go():
        async with gpu_lock.gpu_turn("GPU-back", "evaluate", needs_bytes=3 * GIB, expect_s=LARGE_S) as turn:
            waiter = needs_later("GPU-back", 1 * GIB)
            await queued(turn)
            await turn.hand_over()
            assert turn.handovers == 1
            assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
            assert waiter.wait(20) == 0
            assert await turn.lend() is False  # nobody waits: kept
            waiter = needs_later("GPU-back", None)
            await queued(turn)
            assert await turn.lend() is True
            await turn.take_back()  # (queued at its target: it may come back before the waiter's turn)
        assert waiter.wait(20) == 0

    asyncio.run(go())
    assert said == [3 * GIB, 3 * GIB, 3 * GIB]  # queued first, after the hand-over, after the lend
