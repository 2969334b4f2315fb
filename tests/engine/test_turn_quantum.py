"""A turn lasts at least gpu_lock.MIN_TURN_S of GPU time before its holder hands it over at a turn
point: six benches at once on an H100 handed the GPU over after 0.04-0.6 s of a turn and waited
5-16 s for it back each time. Real processes on a real lock folder; no GPU here."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from kernel_lsp.engine.caller import gpu_lock
from tests.engine.test_gpu_lock import LARGE_S
from tests.engine.test_gpu_turns import _env

HOLD = """
import asyncio, sys
from kernel_lsp.engine.caller import gpu_lock

async def main():
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate"):
        print("held", flush=True)

asyncio.run(main())
"""


async def _queued(turn: gpu_lock.Turn, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while not turn.others_waiting():
        assert time.monotonic() < end, "the other process never queued"
        await asyncio.sleep(0.02)


def test_a_holder_hands_over_only_once_its_turn_has_lasted_the_quantum(lock_dir, monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_GPU_MIN_TURN_S", "1.5")
    key = "GPU-quantum"

    async def go() -> tuple[list, list, bool, float, list, float]:
        async with gpu_lock.gpu_turn(key, "evaluate", expect_s=LARGE_S) as turn:  # the waiter's target is first
            await asyncio.sleep(0.3)
            waiter = subprocess.Popen([sys.executable, "-c", HOLD, key], env=_env(), stdout=subprocess.PIPE, text=True)
            await _queued(turn)
            early = turn.to_hand_over("verify_set", None, None)
            lend = turn.to_lend(None, None)  # lending for CPU work has no quantum: the GPU would idle
            while not turn.to_hand_over("verify_set", None, None):
                await asyncio.sleep(0.02)
            at = time.monotonic() - turn.got_at
            handed = await turn.hand_over("between two of verify's input sets")
            assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
            waiter.wait(10)
            after = turn.others_ahead()  # back: nobody waits
            return early, after, lend, at, turn.kept, handed

    early, after, lend, at, kept, handed = asyncio.run(go())
    assert early == [] and lend is True
    assert 1.5 <= at < 3.0, at  # handed over at the first turn point past the quantum
    assert handed > 0 and after == [] and kept == []  # the quantum is not a memory "kept"


def test_the_quantum_counts_from_when_the_turn_came_back(lock_dir, monkeypatch):
    """After a hand-over, the holder's next turn again lasts the quantum before it hands over."""
    monkeypatch.setenv("KERNEL_LSP_GPU_MIN_TURN_S", "0.8")
    key = "GPU-quantum-back"

    async def go() -> float:
        async with gpu_lock.gpu_turn(key, "evaluate", expect_s=LARGE_S) as turn:
            first = subprocess.Popen([sys.executable, "-c", HOLD, key], env=_env(), stdout=subprocess.PIPE, text=True)
            await _queued(turn)
            while not turn.others_ahead():
                await asyncio.sleep(0.02)
            await turn.hand_over()
            first.wait(10)
            second = subprocess.Popen([sys.executable, "-c", HOLD, key], env=_env(), stdout=subprocess.PIPE, text=True)
            await _queued(turn)
            while not turn.others_ahead():
                await asyncio.sleep(0.02)
            waited = time.monotonic() - turn.got_at
            await turn.hand_over()
            second.wait(10)
            return waited

    assert asyncio.run(go()) >= 0.8


def test_the_quantum_is_read_from_the_environment_and_a_bad_value_is_the_default(monkeypatch):
    monkeypatch.delenv("KERNEL_LSP_GPU_MIN_TURN_S", raising=False)
    assert gpu_lock.min_turn_s() == gpu_lock.MIN_TURN_S == 1.0
    monkeypatch.setenv("KERNEL_LSP_GPU_MIN_TURN_S", "0.5")
    assert gpu_lock.min_turn_s() == 0.5
    monkeypatch.setenv("KERNEL_LSP_GPU_MIN_TURN_S", "-3")
    assert gpu_lock.min_turn_s() == 0.0
    monkeypatch.setenv("KERNEL_LSP_GPU_MIN_TURN_S", "soon")
    assert gpu_lock.min_turn_s() == gpu_lock.MIN_TURN_S
