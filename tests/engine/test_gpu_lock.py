"""The engine's own concurrency never runs a GPU out of memory: kernel-lsp processes take turns
on each GPU through a machine-wide file lock (engine/caller/gpu_lock.py). Real processes and a
real Engine (a CPU Worker, with its GPU key set by hand: there is no GPU here)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.engine.caller import gpu_lock

ROOT = Path(__file__).resolve().parents[2]
# A holder expected to need ten minutes of GPU work (a large Task): any waiter's target comes
# before its own, so the tests of the hand-over's mechanics see it hand the turn over.
LARGE_S = 600.0
HOLD = """
import asyncio, sys
from kernel_lsp.engine.caller import gpu_lock

async def main():
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate"):
        print("held", flush=True)
        await asyncio.sleep(float(sys.argv[2]))

asyncio.run(main())
"""


def hold(key: str, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, key, str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_waits_for_its_turn_and_is_told_who_has_it(lock_dir):
    other = hold("GPU-abc", 1.5)
    told: list[str] = []

    async def go() -> float:
        t0 = time.monotonic()
        async with gpu_lock.gpu_turn("GPU-abc", "evaluate", progress=told.append) as turn:
            assert turn.waited > 1.0
        return time.monotonic() - t0

    took = asyncio.run(go())
    other.wait(10)
    assert took >= 1.0
    assert told and f"kernel-lsp pid {other.pid}" in told[0] and "evaluate" in told[0], told
    # Another GPU is another lock: no wait at all.
    other = hold("GPU-abc", 1.5)
    t0 = time.monotonic()
    asyncio.run(_enter("GPU-other"))
    assert time.monotonic() - t0 < 0.5
    other.kill()
    other.wait(10)


async def _enter(key: str, wait_s: float | None = None) -> None:
    async with gpu_lock.gpu_turn(key, "evaluate", wait_s=wait_s):
        pass


def test_a_turn_held_too_long_is_gpu_busy_and_a_dead_holder_frees_it(lock_dir):
    other = hold("GPU-abc", 30)
    with pytest.raises(gpu_lock.GPUBusy) as caught:
        asyncio.run(_enter("GPU-abc", wait_s=0.3))
    assert f"pid {other.pid}" in str(caught.value)
    other.kill()  # the kernel drops a dead holder's lock: nothing to clean up
    other.wait(10)
    t0 = time.monotonic()
    asyncio.run(_enter("GPU-abc", wait_s=5))
    assert time.monotonic() - t0 < 1.0


def test_no_key_and_turned_off_take_no_lock(lock_dir, monkeypatch):
    asyncio.run(_enter(None))  # a CPU: nothing to hold
    assert not lock_dir.exists()
    monkeypatch.setenv("KERNEL_LSP_GPU_LOCK", "0")
    assert gpu_lock.enabled() is False


@pytest.mark.slow
def test_the_engine_waits_outside_the_deadline_and_gives_up_with_could_not_run(lock_dir, monkeypatch):
    pytest.importorskip("torch")
    from kernel_lsp.cli.bench import status
    from kernel_lsp.engine import Engine
    from kernel_lsp.model import Candidate, Task

    cheats = Path(__file__).parent / "cheats"
    task = Task(name="ref_linear", reference_path=str(cheats / "ref_linear.py"),
                reference_source=(cheats / "ref_linear.py").read_text())
    cand = Candidate(source=(cheats / "correct.py").read_text(), kind="python")

    async def go():
        engine = Engine(timeout=60, options={"device": "cpu", "baselines": False})

        async def key(progress=None) -> str:
            return "GPU-fake"  # as if the Worker's GPU had this uuid
        engine._gpu_key = key  # type: ignore[method-assign]
        try:
            # The Worker is up, and sees the task's folder, before the holder starts: a Worker
            # replaced for the folder (sandboxed) would start inside the holder's turn and
            # shorten the wait this test measures.
            first = await engine.evaluate(task, cand, ("compile", "verify"))
            assert first.verdict == "correct", first.message
            other = hold("GPU-fake", 4.0)
            # A deadline shorter than the wait: waiting for the turn does not count against it.
            waited = await engine.evaluate(task, cand, ("compile", "verify"), timeout=3.5)
            other.wait(10)
            monkeypatch.setenv("KERNEL_LSP_GPU_WAIT_S", "0.5")
            other = hold("GPU-fake", 30)
            busy = await engine.evaluate(task, cand, ("compile", "verify"))
            other.kill()
            other.wait(10)
            return waited, busy, other.pid
        finally:
            await engine.aclose()

    waited, busy, pid = asyncio.run(go())
    assert waited.verdict == "correct", waited.message
    assert waited.evidence["gpu_wait_s"] >= 3.0
    assert busy.verdict == "not_run" and f"kernel-lsp pid {pid}" in busy.message, busy.message
    assert status(busy) == 2


def test_after_waiting_for_the_gpu_the_progress_says_evaluating_again(lock_dir):
    """The wait is shown while it lasts, and the evaluation after it is shown as evaluating (not
    as the wait, in an editor's progress or in bench --timings' spans)."""
    from kernel_lsp.engine import Engine
    from kernel_lsp.model import Candidate, Task

    fake = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run", "KERNEL_LSP_WORKER_PRELOAD": ""}
    task = Task(name="toy", reference_path="toy.py", reference_source="# reference\n")
    cand = Candidate(source="def run():\n    return 6\n", kind="python")

    async def go():
        engine = Engine(timeout=20.0, warm=False, env=fake, sandbox="off")

        async def key(progress=None) -> str:
            return "GPU-fake"
        engine._gpu_key = key  # type: ignore[method-assign]
        try:
            await engine.ping()  # the Worker is up: only the wait is reported before the evaluation
            other = hold("GPU-fake", 1.0)
            phases: list[str] = []
            ev = await engine.evaluate(task, cand, progress=phases.append)
            other.wait(10)
            return ev, phases
        finally:
            await engine.aclose()

    ev, phases = asyncio.run(go())
    assert ev.verdict == "correct", ev.message
    waiting = [i for i, p in enumerate(phases) if p.startswith("waiting for the GPU")]
    assert waiting and phases[waiting[0] + 1:] == ["evaluating", "done"], phases


# Takes the GPU turn once the other process's build has begun (argv[2] exists), says so in argv[3]
# (with the time), holds it a moment, and lets go.
TAKE_WHEN_BUILDING = """
import asyncio, os, sys, time
from kernel_lsp.engine.caller import gpu_lock

async def main():
    while not os.path.exists(sys.argv[2]):
        await asyncio.sleep(0.02)
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate"):
        with open(sys.argv[3], "w") as f:
            f.write(repr(time.time()))
        await asyncio.sleep(0.5)

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_build_runs_outside_the_gpu_turn_so_another_process_times_meanwhile(lock_dir, tmp_path):
    """A kept Worker builds its own candidates (no CPU pool): the build happens before the GPU
    turn is taken. The candidate's module waits, while it is built, until another process has
    had the GPU: were the build inside the turn, that process could not get it until the
    evaluation ended (and the build would wait out its 60 s). Order: build begins, the other
    process's turn, build ends, then this evaluation's turn (after a wait)."""
    pytest.importorskip("torch")
    from kernel_lsp.engine import Engine
    from kernel_lsp.model import Candidate, Task

    cheats = Path(__file__).parent / "cheats"
    began, turn, ended = tmp_path / "began", tmp_path / "turn", tmp_path / "ended"
    prelude = (
        "# load_inline: (the engine treats this file as one that builds an extension)\n"
        "import os as _os, time as _time\n"
        f"if not _os.path.exists({str(ended)!r}):  # the build: the first time this module runs\n"
        f"    open({str(began)!r}, 'w').close()\n"
        "    _t = _time.time()\n"
        f"    while not _os.path.exists({str(turn)!r}) and _time.time() - _t < 60:\n"
        "        _time.sleep(0.02)\n"
        f"    open({str(ended)!r}, 'w').write(repr(_time.time()))\n"
    )
    task = Task(name="ref_linear", reference_path=str(cheats / "ref_linear.py"),
                reference_source=(cheats / "ref_linear.py").read_text())
    cand = Candidate(source=prelude + (cheats / "correct.py").read_text(), kind="python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    async def go():
        engine = Engine(timeout=120, options={"device": "cpu", "baselines": False}, prebuild=False, sandbox="off")

        async def key(progress=None) -> str:
            return "GPU-fake"
        engine._gpu_key = key  # type: ignore[method-assign]
        other = subprocess.Popen([sys.executable, "-c", TAKE_WHEN_BUILDING, "GPU-fake", str(began), str(turn)],
                                 env=env)
        phases: list[str] = []
        try:
            ev = await engine.evaluate(task, cand, ("compile", "verify"), progress=phases.append)
        finally:
            await engine.aclose()
            other.wait(30)
        return ev, phases

    ev, phases = asyncio.run(go())
    assert ev.verdict == "correct", ev.message
    assert float(turn.read_text()) < float(ended.read_text()), "the other process got the GPU only after the build"
    assert ev.evidence["gpu_wait_s"] > 0  # then this evaluation waited for the other's turn
    assert "compiling" in phases and phases.index("compiling") < len(phases) - 1 - phases[::-1].index("evaluating")


def test_a_turn_is_handed_over_only_when_the_paused_evaluation_keeps_little_on_the_gpu(lock_dir):
    """Four benches of a 6 GiB softmax on an H100: one handed its turn over with its live data on
    the GPU and the next ran out of memory. A turn point that says it holds more than
    HAND_OVER_MAX_HELD of the card keeps the turn; one that holds little hands it over."""
    from kernel_lsp.engine import Engine
    from kernel_lsp.engine.caller.client import _Deadline

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    total = 80 << 30
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    async def go() -> tuple[list, float, float, int]:
        engine = Engine(timeout=60, options={"device": "cpu"})
        async with gpu_lock.gpu_turn("GPU-turns", "evaluate", expect_s=LARGE_S) as turn:
            waiter = subprocess.Popen([sys.executable, "-c", HOLD, "GPU-turns", "0"], env=env,
                                      stdout=subprocess.PIPE, text=True)
            await queued(turn)
            t0 = time.monotonic()
            await engine._hand_over(turn, {"stage": "verify_set", "turn": 1, "held_bytes": 22 << 30,
                                           "total_bytes": total}, release, _Deadline(60), None, None)
            kept_s = time.monotonic() - t0
            kept = list(turn.kept)
            assert waiter.poll() is None and not released  # still waiting: the turn was kept
            t0 = time.monotonic()
            await engine._hand_over(turn, {"stage": "verify_set", "turn": 2, "held_bytes": 4 << 30,
                                           "total_bytes": total}, release, _Deadline(60), None, None)
            handed_s = time.monotonic() - t0
            assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
            waiter.wait(10)
            return kept, kept_s, handed_s, turn.handovers

    kept, kept_s, handed_s, handovers = asyncio.run(go())
    assert kept == [{"stage": "verify_set", "held_bytes": 22 << 30, "paused_bytes": 0}]
    assert kept_s < 0.5
    assert released == [True] and handovers == 1  # the small one: cache released, GPU lent, taken back


def test_may_hand_over_reads_unknown_sizes_as_yes():
    assert gpu_lock.may_hand_over(None, None)
    assert gpu_lock.may_hand_over(1 << 30, None)
    assert gpu_lock.may_hand_over(10 << 30, 80 << 30)
    assert not gpu_lock.may_hand_over(11 << 30, 80 << 30)
    # What the paused evaluations hold counts with its own.
    assert gpu_lock.may_hand_over(4 << 30, 80 << 30, paused_bytes=6 << 30)
    assert not gpu_lock.may_hand_over(6 << 30, 80 << 30, paused_bytes=6 << 30)


def test_a_turn_is_kept_while_paused_evaluations_already_hold_the_share(lock_dir):
    """Four benches of a 6 GiB softmax on an H100, with the rule counted per evaluation: three
    paused holders of 6 GiB each left the runner too little for its float64 oracle on the GPU (it
    ran on the host CPU, 37-191 s a verify). A holder counts the paused ones' markers with its own
    live data; a dead process's marker is not counted."""
    from kernel_lsp.engine import Engine
    from kernel_lsp.engine.caller.client import _Deadline

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    total = 80 << 30
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)

    async def go() -> tuple[list, int]:
        engine = Engine(timeout=60, options={"device": "cpu"})
        async with gpu_lock.gpu_turn("GPU-paused", "evaluate", expect_s=LARGE_S) as turn:
            paused = gpu_lock._Paused("GPU-paused", 6 << 30)  # another evaluation, paused with 6 GiB
            folder = Path(gpu_lock.paused_dir("GPU-paused"))
            (folder / f"{dead.pid}-1").write_text('{"pid": %d, "held_bytes": %d}' % (dead.pid, 40 << 30))
            assert turn.paused_bytes() == 6 << 30  # the dead one's 40 GiB is not counted
            assert not (folder / f"{dead.pid}-1").exists()
            waiter = subprocess.Popen([sys.executable, "-c", HOLD, "GPU-paused", "0"], env=env,
                                      stdout=subprocess.PIPE, text=True)
            await queued(turn)
            point = {"stage": "verify_set", "turn": 1, "held_bytes": 6 << 30, "total_bytes": total}
            await engine._hand_over(turn, point, release, _Deadline(60), None, None)
            assert waiter.poll() is None and not released  # 6 + 6 GiB > 1/8 of 80: kept
            paused.remove()  # the other one has the GPU back: now 6 GiB alone may pause
            await engine._hand_over(turn, {**point, "turn": 2}, release, _Deadline(60), None, None)
            assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
            waiter.wait(10)
            return list(turn.kept), turn.handovers

    kept, handovers = asyncio.run(go())
    assert kept == [{"stage": "verify_set", "held_bytes": 6 << 30, "paused_bytes": 6 << 30}]
    assert released == [True] and handovers == 1


def test_an_evaluation_without_the_turn_is_marked_paused_with_what_it_holds(lock_dir):
    """While it has handed the turn over (or lent it), its live bytes are in its marker, for the
    others' decision; the marker goes once it has the turn back."""
    seen: list[int] = []

    async def go() -> int:
        async with gpu_lock.gpu_turn("GPU-mark", "evaluate", expect_s=LARGE_S) as turn:
            waiter = hold_later("GPU-mark", 0.6)
            await queued(turn)

            async def watch() -> None:
                while True:
                    seen.append(gpu_lock.paused_bytes("GPU-mark"))
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watch())
            took = await turn.hand_over("between two input sets", held_bytes=3 << 30)
            watcher.cancel()
            waiter.wait(10)
            assert took >= 0.5
            lent = await turn.lend("while torch.compile compiles", held_bytes=2 << 30)
            assert not lent  # nobody waits: kept, nothing marked
            return gpu_lock.paused_bytes("GPU-mark")

    after = asyncio.run(go())
    assert 3 << 30 in seen, seen[:5]
    assert after == 0


def test_a_turn_that_ends_while_lent_leaves_no_paused_marker(lock_dir):
    """A long-lived process (the language server) whose evaluation is cancelled while it has lent
    the GPU must not leave its bytes counted as paused for the others."""
    async def go() -> int:
        async with gpu_lock.gpu_turn("GPU-end", "evaluate", expect_s=LARGE_S) as turn:
            waiter = hold_later("GPU-end", 0)
            await queued(turn)
            assert await turn.lend("while torch.compile compiles", held_bytes=5 << 30)
            assert gpu_lock.paused_bytes("GPU-end") == 5 << 30
        waiter.wait(10)
        return gpu_lock.paused_bytes("GPU-end")

    assert asyncio.run(go()) == 0


async def queued(turn: gpu_lock.Turn) -> None:
    """Until another process queues for `turn`'s GPU (a waiter started just before)."""
    for _ in range(200):
        if turn.others_waiting():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the waiter never queued")


def hold_later(key: str, seconds: float) -> subprocess.Popen:
    """A process that queues for `key` now and holds it `seconds` once it gets it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-c", HOLD, key, str(seconds)], env=env, stdout=subprocess.DEVNULL)


def test_a_holder_keeps_its_turn_until_it_runs_past_what_it_was_expected_to_need(lock_dir):
    """Turns go by target: when an evaluation started plus TARGET_FACTOR times its expected alone
    time. A holder expected to need 0.6 s of GPU work keeps its turn at a turn point while a waiter
    that queued after it (expected EXPECT_BASE_S) has the later target; once it has run past its
    0.6 s its target grows with its work, passes the waiter's, and it hands over and gets the turn
    back after."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    async def go() -> tuple[float, bool, float, int, list, float]:
        async with gpu_lock.gpu_turn("GPU-fair", "evaluate", expect_s=0.6) as turn:
            waiter = subprocess.Popen([sys.executable, "-c", HOLD, "GPU-fair", "0"], env=env,
                                      stdout=subprocess.PIPE, text=True)
            await queued(turn)
            ahead_early = turn.others_ahead()
            kept_s = await turn.hand_over("between two stages")
            still_waiting = waiter.poll() is None
            while not turn.others_ahead():
                await asyncio.sleep(0.05)
            served = turn.served()
            handed_s = await turn.hand_over("between two stages")
            assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
            waiter.wait(10)
            return kept_s, still_waiting, handed_s, turn.handovers, ahead_early, served

    kept_s, still_waiting, handed_s, handovers, ahead_early, served = asyncio.run(go())
    assert ahead_early == [] and kept_s == 0.0 and still_waiting  # kept: its target came first
    # The waiter's target: its start (a moment after the holder's) plus 3 x EXPECT_BASE_S; the
    # holder's, once past its 0.6 s, is its start plus 3 x (served + MIN_LEFT_S): it passes the
    # waiter's when served is above EXPECT_BASE_S - MIN_LEFT_S.
    assert served > gpu_lock.EXPECT_BASE_S - gpu_lock.MIN_LEFT_S - 0.05, served
    assert handovers == 1 and handed_s > 0  # then handed over, and back


def test_a_small_tasks_waiter_goes_before_a_large_tasks_holder(lock_dir):
    """The six-at-once run this policy is for: a 6 GiB softmax that took the GPU first kept the
    2 MiB LayerNorm waiting 7.5 s (10.6 s against 2.0 s alone). Expected from its Task's data, the
    large holder's target comes after a small waiter's at once, and it hands over at its first
    turn point; a small holder keeps its turn from a large waiter."""
    large = gpu_lock.expected_gpu_s(12 << 30)  # one 6 GiB input set and its outputs
    small = gpu_lock.expected_gpu_s(4 << 20)
    assert large > small + 6 > small > gpu_lock.EXPECT_BASE_S - 0.01

    async def go(expect_s: float) -> tuple[list, int]:
        async with gpu_lock.gpu_turn("GPU-size", "evaluate", expect_s=expect_s) as turn:
            waiter = hold_later("GPU-size", 0)
            await queued(turn)
            ahead = turn.others_ahead()
            await turn.hand_over("between two stages")
            handovers = turn.handovers
        waiter.wait(10)
        return ahead, handovers

    ahead, handovers = asyncio.run(go(large))
    assert len(ahead) == 1 and handovers == 1
    ahead, handovers = asyncio.run(go(small - 1.0))
    assert ahead == [] and handovers == 0


def test_the_early_timing_sets_what_is_left(lock_dir):
    """After the early timing, the work left is the final timing, expected as long as the early
    one took (FINAL_PER_EARLY): a slow candidate (kahan_sum, 5.6 s for 32 MiB) is seen there."""
    turn = gpu_lock.Turn("GPU-early", fd=-1, expect_s=5.0)
    turn.passed("verify_set")
    assert turn.left_s == 5.0
    turn.passed("verify")
    turn.served_s += 2.0  # the early timing's two seconds (the turn itself counts as held)
    turn.passed("early_timing")
    assert abs(turn.left_s - 2.0 * gpu_lock.FINAL_PER_EARLY) < 0.05, turn.left_s
    assert abs(turn.left_from - turn.served()) < 0.05
    # Unsized (alone when it queued), it is expected from the data the Worker says at a turn point,
    # once; sized, what it says changes nothing.
    unsized = gpu_lock.Turn("GPU-early", fd=-1)
    assert not unsized.sized and unsized.left_s == gpu_lock.EXPECT_BASE_S
    unsized.passed("verify_set", data_bytes=12 << 30)
    assert unsized.sized and abs(unsized.left_s - gpu_lock.expected_gpu_s(12 << 30)) < 0.05
    turn.passed("verify_set", data_bytes=12 << 30)
    assert abs(turn.left_s - 2.0 * gpu_lock.FINAL_PER_EARLY) < 0.05
    # Past what is left, the target grows with its own work; never below MIN_LEFT_S left.
    origin = turn.origin_ns
    assert gpu_lock.target_ns(origin, 1.0, -3.0) == origin + int(gpu_lock.TARGET_FACTOR * (1.0 + gpu_lock.MIN_LEFT_S) * 1e9)


def test_a_hand_over_queues_at_its_target(lock_dir, monkeypatch):
    """The places a holder queues at: first its start plus 3 x what it is expected to need; when it
    hands over, its start plus 3 x (its own work so far plus what is left), which stays where it
    was while it works within what it was expected to need."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    places: list[int] = []
    real = gpu_lock._Waiter

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, key, what, place_ns=None, needs_bytes=None):
            super().__init__(key, what, place_ns, needs_bytes)
            places.append(self.place_ns)

    monkeypatch.setattr(gpu_lock, "_Waiter", Recorded)

    async def go() -> tuple[int, float, float]:
        origin = time.time_ns()
        async with gpu_lock.gpu_turn("GPU-place", "evaluate", origin_ns=origin, expect_s=LARGE_S) as turn:
            waiter = subprocess.Popen([sys.executable, "-c", HOLD, "GPU-place", "0"], env=env,
                                      stdout=subprocess.PIPE, text=True)
            while not turn.others_ahead() or time.monotonic() - turn.got_at < 0.5:  # it queues after this
                await asyncio.sleep(0.05)                                           # one took the turn
            held = time.monotonic() - turn.got_at
            await turn.hand_over()
            assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
            waiter.wait(10)
            return origin, held, turn.served_s

    origin, held, served = asyncio.run(go())
    assert abs(served - held) < 0.1, (served, held)
    first = origin + gpu_lock.TARGET_FACTOR * LARGE_S * 1e9
    assert abs(places[0] - first) / 1e9 < 0.1 and abs(places[-1] - first) / 1e9 < 0.3, (places, first)


def test_a_waiter_place_orders_the_queue(lock_dir):
    """The queue sorts by place: a target before another's goes first."""
    now = time.time_ns()
    late = gpu_lock._Waiter("GPU-order", "evaluate", place_ns=now + 5_000_000_000)
    early = gpu_lock._Waiter("GPU-order", "evaluate", place_ns=now - 5_000_000_000)
    try:
        assert early.first() and not late.first()
        names = [name for name, _ in gpu_lock._queue(gpu_lock.waiters_dir("GPU-order"))]
        assert names == [early.name, late.name]
        before = gpu_lock.others_waiting_in(gpu_lock.waiters_dir("GPU-order"), before=gpu_lock._place(now))
        assert len(before) == 1
    finally:
        early.remove()
        late.remove()
