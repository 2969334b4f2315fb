"""Bounded GPU turns (caller/gpu_lock.py, protocol.YIELD_TURNS): waiters queue in files beside the
lock, first come first served; a holder whose evaluation reaches a turn point between its stages
hands the GPU to a waiting process and takes it back after. Real processes, real Workers (the
stand-in run module for the fast ones, the real one on the CPU for the slow one), the lock in a
test folder ($KERNEL_LSP_GPU_LOCK_DIR) with a GPU key set by hand: there is no GPU here."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller import gpu_lock
from kernel_lsp.engine.caller.process import WorkerProcess, default_python, worker_environment
from kernel_lsp.engine.worker.judge import memory_plan
from kernel_lsp.model import Candidate, Task

from tests.engine.test_keeper import keeper_dir  # noqa: F401 - a fixture: kept Workers' own folder, cleaned up
from tests.engine.test_gpu_lock import LARGE_S

ROOT = Path(__file__).resolve().parents[2]
KEY = "GPU-fake"
FAKE = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run", "KERNEL_LSP_WORKER_PRELOAD": ""}

# Waits for the turn of argv[1] (once argv[2] exists, when given), then appends argv[3] to the
# file argv[4] and holds the turn argv[5] seconds.
TAKE = """
import asyncio, os, sys
from kernel_lsp.engine.caller import gpu_lock

async def main():
    while sys.argv[2] and not os.path.exists(sys.argv[2]):
        await asyncio.sleep(0.02)
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate"):
        with open(sys.argv[4], "a") as f:
            f.write(sys.argv[3] + "\\n")
        await asyncio.sleep(float(sys.argv[5]))

asyncio.run(main())
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def take(name: str, log: Path, hold: float = 0.0, after: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TAKE, KEY, str(after or ""), name, str(log), str(hold)],
                            env=_env())


def until(what, within: float = 60.0) -> None:
    """Wait for a condition another process brings about (a bound against a hang, not a measure)."""
    deadline = time.monotonic() + within
    while not what():
        assert time.monotonic() < deadline, "the other process never got there"
        time.sleep(0.02)


async def until_async(what, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not what():
        assert time.monotonic() < deadline, "the other process never got there"
        await asyncio.sleep(0.02)


def waiting_pids() -> list[int]:
    return [int(w["pid"]) for w in gpu_lock.others_waiting(KEY)]


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def on_fake_gpu(engine):
    """The Engine takes the turn of KEY as if its Worker's GPU had that uuid (a CPU Worker here)."""
    async def key(progress=None) -> str:
        return KEY
    engine._gpu_key = key  # type: ignore[method-assign]
    return engine


# -- the queue ------------------------------------------------------------------------------------

def test_a_waiter_announces_itself_and_its_file_goes_once_it_has_the_turn(lock_dir, tmp_path):
    log = tmp_path / "log"

    async def go():
        async with gpu_lock.gpu_turn(KEY, "evaluate") as turn:
            assert turn.others_waiting() == []
            other = take("other", log)
            await until_async(lambda: waiting_pids() == [other.pid])
            [entry] = os.listdir(gpu_lock.waiters_dir(KEY))
            assert f"-{other.pid}-" in entry
            seen = turn.others_waiting()
            assert seen[0]["op"] == "evaluate" and "kernel-lsp pid" in gpu_lock.describe(seen[0])
        return other

    other = asyncio.run(go())  # leaving the block lets the lock go: the waiter takes it
    assert other.wait(30) == 0
    assert lines(log) == ["other"]
    assert gpu_lock.others_waiting(KEY) == [] and os.listdir(gpu_lock.waiters_dir(KEY)) == []


def test_a_dead_or_silent_waiters_file_is_passed_over(lock_dir):
    folder = Path(gpu_lock.waiters_dir(KEY))
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Older than anyone: were they believed, nobody else could ever be first in line.
        (folder / f"{1:020d}-{dead.pid}-1").write_text(json.dumps({"pid": dead.pid, "op": "evaluate"}))
        silent = folder / f"{2:020d}-{sleeper.pid}-1"
        silent.write_text(json.dumps({"pid": sleeper.pid, "op": "evaluate"}))
        old = time.time() - gpu_lock.STALE_S - 5
        os.utime(silent, (old, old))
        assert gpu_lock.others_waiting(KEY) == []
        assert not (folder / f"{1:020d}-{dead.pid}-1").exists()  # a dead pid's file is cleaned up
        asyncio.run(_enter(wait_s=5.0))  # not GPUBusy: the lock is taken past them
        os.utime(silent)  # touched again: it waits, and is first in line
        assert [w["pid"] for w in gpu_lock.others_waiting(KEY)] == [sleeper.pid]
        with pytest.raises(gpu_lock.GPUBusy):
            asyncio.run(_enter(wait_s=0.5))
    finally:
        sleeper.kill()
        sleeper.wait(30)


async def _enter(wait_s: float | None = None) -> None:
    async with gpu_lock.gpu_turn(KEY, "evaluate", wait_s=wait_s):
        pass


def test_turns_go_first_come_first_served(lock_dir, tmp_path):
    """Two processes wait, the second after the first: they get the GPU in that order (they
    both poll the lock; only the first in line tries it)."""
    log = tmp_path / "log"

    async def go():
        async with gpu_lock.gpu_turn(KEY, "evaluate"):
            first = take("first", log, hold=0.3)
            await until_async(lambda: waiting_pids() == [first.pid])
            second = take("second", log, hold=0.3)
            await until_async(lambda: waiting_pids() == [first.pid, second.pid])
        return first, second

    first, second = asyncio.run(go())
    assert first.wait(30) == 0 and second.wait(30) == 0
    assert lines(log) == ["first", "second"]


def test_handing_over_lets_the_waiters_in_before_the_holder_takes_it_back(lock_dir, tmp_path):
    """The holder hands the GPU over: both processes waiting then have their turns, in order,
    before it is back (it queued behind them), and the progress says to whom it went."""
    log = tmp_path / "log"
    told: list[str] = []

    async def go():
        async with gpu_lock.gpu_turn(KEY, "evaluate", expect_s=LARGE_S) as turn:
            assert await turn.hand_over("between verify and timing", told.append) == 0.0  # nobody waits
            first = take("first", log, hold=0.2)
            await until_async(lambda: waiting_pids() == [first.pid])
            second = take("second", log, hold=0.2)
            await until_async(lambda: waiting_pids() == [first.pid, second.pid])
            away = await turn.hand_over("between verify and timing", told.append)
            with open(log, "a") as f:
                f.write("holder\n")
            held = gpu_lock.holder(gpu_lock.lock_path(KEY))
            assert held and held["pid"] == os.getpid()  # back, stamped as the holder again
            assert turn.others_waiting() == []
            return first, second, away, turn

    first, second, away, turn = asyncio.run(go())
    assert first.wait(30) == 0 and second.wait(30) == 0
    assert lines(log) == ["first", "second", "holder"]
    assert away > 0 and turn.handed_s == away and turn.handovers == 1
    assert len(told) == 1 and "evaluate" in told[0], told
    assert told[0].startswith(f"handed the GPU to kernel-lsp pid {first.pid} (")
    assert told[0].endswith("between verify and timing; waiting for it back"), told


# -- the Worker's turn points -------------------------------------------------------------------------

STAGES = """
import os
def run():
    return 1
def after_turn():
    open(os.environ["AFTER_TURN"], "w").close()
    return 2
"""


def test_a_worker_asked_for_turns_waits_at_its_turn_point_for_the_continue_line(tmp_path):
    """A real Worker process (stand-in run module with one turn point between two stages of the
    candidate): asked (yield_turns), it sends the turn point and goes on only once told to;
    not asked, it never sends one. The raw protocol, no Engine."""
    after = tmp_path / "after_turn"
    task = Task(name="t", reference_path=str(tmp_path / "t.py"), reference_source="x = 1\n")
    cand = Candidate(source=STAGES, kind="python")

    async def go():
        w = WorkerProcess(default_python(), worker_environment(None, {**FAKE, "AFTER_TURN": str(after)}),
                          sandbox="off")
        await w.start(60)
        try:
            points: list[tuple[dict, bool]] = []

            async def on_turn(data: dict, release) -> None:
                await release()  # as before a hand-over: the Worker frees its cached GPU memory, and waits on
                await asyncio.sleep(0.5)  # the Worker must not go on meanwhile
                points.append((data, after.exists()))
            params = {"task": task.to_dict(), "candidate": cand.to_dict(),
                      "options": {protocol.YIELD_TURNS: True}}
            asked, _ = await w.call("evaluate", params, on_turn=on_turn)
            after.unlink()
            unasked: list = []

            async def never(data: dict, release) -> None:
                unasked.append(data)
            plain, _ = await w.call("evaluate", dict(params, options={}), on_turn=never)
            # A continue line nobody waits for (a stale one) is skipped, not answered.
            w.proc.stdin.write(protocol.encode(protocol.resume(99)))
            pong, _ = await w.call("ping")
            return points, asked, plain, unasked, pong
        finally:
            await w.close()

    points, asked, plain, unasked, pong = asyncio.run(go())
    assert [(d["stage"], went_on) for d, went_on in points] == [("verify", False)]
    [taken] = asked["evidence"]["turns"]
    assert asked["message"] == "ran: 2" and taken["waited_s"] >= 0.5 and taken["released"] is True
    assert plain["message"] == "ran: 2" and unasked == [] and "turns" not in (plain.get("evidence") or {})
    assert pong["requests"] == 3


# Once argv[4] exists, waits for the GPU argv[1], writes argv[2] when it has it, holds it argv[3] seconds.
# A small Task (no GPU work expected): its target comes before the evaluation's, which it waits behind.
GRAB_WHEN_BEGUN = """
import asyncio, os, sys
from kernel_lsp.engine.caller import gpu_lock

async def main():
    while not os.path.exists(sys.argv[4]):
        await asyncio.sleep(0.02)
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate", expect_s=0):
        open(sys.argv[2], "w").close()
        await asyncio.sleep(float(sys.argv[3]))

asyncio.run(main())
"""

# The candidate's first stage says it began and waits (bounded) until another process waits for
# the GPU; its second stage, after the turn point, says whether that process has had the GPU.
TWO_STAGES = """
import os, time
def run():
    open(os.environ["BEGAN"], "w").close()
    folder = os.path.join(os.environ["KERNEL_LSP_GPU_LOCK_DIR"], "GPU-fake.lock.waiters")
    t = time.time()
    while time.time() - t < 60 and not (os.path.isdir(folder) and [n for n in os.listdir(folder) if not n.startswith(".")]):
        time.sleep(0.02)
    return "began"
def after_turn():
    return os.path.exists(os.environ["HAD_IT"])
"""


def _engine_pair(tmp_path, lock_dir, timeout: float, hold: float, keep: float | None = None, end_other: bool = False):
    """An Engine evaluating TWO_STAGES on the fake GPU while another process waits for the GPU
    from the candidate's first stage on, and holds it `hold` seconds once it has it (killed
    after the evaluation when `end_other`)."""
    from kernel_lsp.engine import Engine

    began, had_it = tmp_path / "began", tmp_path / "had_it"
    task = Task(name="t", reference_path=str(tmp_path / "t.py"), reference_source="x = 1\n")
    cand = Candidate(source=TWO_STAGES, kind="python")
    env = {**FAKE, "BEGAN": str(began), "HAD_IT": str(had_it), "KERNEL_LSP_GPU_LOCK_DIR": str(lock_dir)}

    async def go():
        engine = on_fake_gpu(Engine(timeout=timeout, warm=False, env=env, sandbox="off", prebuild=False,
                                    keep_worker=keep))
        # The other process is up (polling for `began`) before the evaluation's deadline starts.
        other_env = {k: v for k, v in _env().items() if k != "KERNEL_LSP_GPU_WAIT_S"}
        other = subprocess.Popen([sys.executable, "-c", GRAB_WHEN_BEGUN, KEY, str(had_it), str(hold), str(began)],
                                 env=other_env)
        try:
            await engine.ping()
            phases: list[str] = []
            ev = await engine.evaluate(task, cand, progress=phases.append)
            return ev, phases, other.pid, engine.restarts
        finally:
            await engine.aclose()
            if end_other:
                other.kill()
            assert other.wait(60) == (-9 if end_other else 0)

    return asyncio.run(go())


def test_a_waiting_process_gets_the_gpu_at_the_evaluations_turn_point(tmp_path, lock_dir):
    """Another process that waits for the GPU gets it at the evaluation's turn point, not after
    the whole evaluation (as it did before turns were handed over: the candidate's second stage
    then found that it had not had the GPU, "ran: False")."""
    ev, phases, pid, _ = _engine_pair(tmp_path, lock_dir, timeout=60, hold=0.1)
    assert ev.verdict == "correct" and ev.message == "ran: True", ev.message
    assert ev.evidence["gpu_handed_over_s"] > 0
    assert [(t["stage"], t["released"]) for t in ev.evidence["turns"]] == [("verify", True)]
    handed = [p for p in phases if p.startswith("handed the GPU")]
    assert handed and handed[0].startswith(f"handed the GPU to kernel-lsp pid {pid} (")
    assert handed[0].endswith("between verify and timing; waiting for it back")
    i = phases.index(handed[0])
    assert phases[i + 1:] == ["evaluating", "done"], phases


def test_a_kept_worker_hands_over_too_its_keeper_passes_the_continue_line_on(tmp_path, lock_dir, keeper_dir):
    """`kernel-lsp bench`'s kept Worker (caller/keeper.py): the turn point reaches the Engine
    through the keeper, and the Engine's continue line reaches the Worker through it."""
    ev, phases, pid, _ = _engine_pair(tmp_path, lock_dir, timeout=60, hold=0.1, keep=30)
    assert ev.verdict == "correct" and ev.message == "ran: True", ev.message
    assert [(t["stage"], t["released"]) for t in ev.evidence["turns"]] == [("verify", True)]
    assert any(p.startswith(f"handed the GPU to kernel-lsp pid {pid} (") for p in phases), phases


def test_a_turn_that_does_not_come_back_is_could_not_run(tmp_path, lock_dir, monkeypatch):
    """Handed over, the GPU stays with the other process past the wait ($KERNEL_LSP_GPU_WAIT_S):
    the evaluation is not_run (exit 2), naming who kept it, and its Worker (stopped at the turn
    point) is ended, not left waiting."""
    from kernel_lsp.cli.bench import status

    monkeypatch.setenv("KERNEL_LSP_GPU_WAIT_S", "1")
    ev, phases, pid, restarts = _engine_pair(tmp_path, lock_dir, timeout=60, hold=60, end_other=True)
    assert ev.verdict == "not_run" and f"kernel-lsp pid {pid}" in ev.message, ev.message
    assert status(ev) == 2 and restarts == 1
    assert any(p.startswith("handed the GPU to") for p in phases), phases


@pytest.mark.slow
def test_the_time_without_the_gpu_is_not_counted_in_the_deadline(tmp_path, lock_dir):
    """The other process holds the GPU longer than this evaluation's whole deadline: the
    evaluation still ends correct (its deadline stopped while it waited)."""
    ev, phases, _, _ = _engine_pair(tmp_path, lock_dir, timeout=4.0, hold=6.0)
    assert ev.verdict == "correct" and ev.message == "ran: True", ev.message
    assert ev.evidence["gpu_handed_over_s"] >= 6.0


def test_nobody_waiting_the_turn_point_goes_on_at_once(tmp_path, lock_dir):
    """The Engine asks for turn points only when it holds the GPU's lock; with nobody waiting it
    says go on at once, and says nothing of a hand-over."""
    from kernel_lsp.engine import Engine

    task = Task(name="t", reference_path=str(tmp_path / "t.py"), reference_source="x = 1\n")
    cand = Candidate(source="def run():\n    return 6\n", kind="python")

    async def go():
        engine = Engine(timeout=30, warm=False, env=FAKE, sandbox="off", prebuild=False)
        try:
            plain = await engine.evaluate(task, cand)  # a CPU: no lock, no turn points

            on_fake_gpu(engine)
            phases: list[str] = []
            locked = await engine.evaluate(task, cand, progress=phases.append)
            return plain, locked, phases
        finally:
            await engine.aclose()

    plain, locked, phases = asyncio.run(go())
    assert "turns" not in (plain.evidence or {})
    assert [(t["stage"], t["released"]) for t in locked.evidence["turns"]] == [("verify", False)]
    assert "gpu_handed_over_s" not in locked.evidence and not any(p.startswith("handed") for p in phases)


# -- the real run module on the CPU ----------------------------------------------------------------

@pytest.mark.slow
def test_the_real_worker_stops_between_its_stages_only_when_asked(tmp_path):
    """The real run module (verify, the early timing, torch.compile, the final timing on the
    CPU): asked, it stops between verify's input sets, after verify, after the early timing and
    after torch.compile's compilation, in that order, the early result after verify; not asked,
    never."""
    pytest.importorskip("torch")
    from kernel_lsp.engine import find_task

    from tests.cpu_task import TASK

    path = tmp_path / "rowsum.py"
    path.write_text(TASK)
    task, cand = find_task(str(path), TASK)
    quick = {"bench_seconds": 0.2, "runs": 10, "device": "cpu", "cache_probe": False,
             "baseline_keep_spread_pct": 1000}

    async def go():
        w = WorkerProcess(default_python(), worker_environment(), sandbox="off")
        await w.start(120)
        try:
            seen: list[str] = []

            async def on_turn(data: dict, release) -> None:
                seen.append(f"turn {data['stage']}")
                sizes.append(data.get("data_bytes"))

            def on_partial(kind: str, data: dict) -> None:
                seen.append(kind)
            params = {"task": task.to_dict(), "candidate": cand.to_dict(), "checks": ["compile", "verify", "bench"],
                      "options": {**quick, protocol.EARLY_RESULT: True, protocol.YIELD_TURNS: True}}
            asked, _ = await w.call("evaluate", params, on_partial=on_partial, on_turn=on_turn)
            quiet: list[str] = []

            async def never(data: dict, release) -> None:
                quiet.append(data["stage"])
            plain, _ = await w.call("evaluate", dict(params, options=dict(quick)), on_turn=never)
            return seen, asked, quiet, plain
        finally:
            await w.close()

    sizes: list = []
    seen, asked, quiet, plain = asyncio.run(go())
    # Each point says the Task's data (one input set and its output), from which an evaluation
    # that queued unsized is expected (gpu_lock.Turn.passed).
    assert sizes == [(384 * 256 + 384) * 4] * 5, sizes  # a float32 384 x 256 input, its 384 row sums
    # Between verify's input sets (3 fresh sets: two points), then between the stages.
    stages = ["verify_set", "verify_set", "verify", "early_timing", "torch_compile"]
    assert seen == [f"turn {s}" for s in stages[:3]] + [protocol.PARTIAL_EVALUATION, "turn early_timing",
                                                         "turn torch_compile"]
    assert asked["verdict"] == "correct" and asked["compiled"] is not None
    assert [t["stage"] for t in asked["evidence"]["turns"]] == stages
    assert "handed_over_s" in asked["evidence"]["phases"]
    assert quiet == [] and plain["verdict"] == "correct" and "turns" not in plain["evidence"]


# -- the GPU ---------------------------------------------------------------------------------------

# Six-at-once on one GPU: a large Task's turn must not hold the others for its whole evaluation.
BIG = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(SIZE)]


def get_init_inputs():
    return []
'''


def _tasks(tmp_path: Path, big_source: str, small_source: str) -> list[tuple]:
    """(Task, Candidate) of big.py and small.py, written from these sources."""
    from kernel_lsp.engine import find_task

    out = []
    for name, source in (("big.py", big_source), ("small.py", small_source)):
        (tmp_path / name).write_text(source)
        out.append(find_task(str(tmp_path / name), source))
    return out


async def _two_engines() -> tuple:
    """Two Engines (two Workers) on this GPU, both started."""
    from kernel_lsp.engine import Engine

    a, b = Engine(timeout=600, sandbox="off"), Engine(timeout=600, sandbox="off")
    await a.device_info()
    await b.device_info()
    return a, b


@pytest.mark.gpu
def test_on_a_gpu_a_small_evaluation_gets_its_turn_inside_a_large_ones(tmp_path, lock_dir):
    """Two Engines (two Workers) on one GPU: a large softmax starts first; a small one started
    once the large one holds the GPU gets it at the large one's first turn point once that turn has
    lasted gpu_lock.MIN_TURN_S (between two of its verify's input sets, after its verify or its
    early timing, or lent while torch.compile compiles), not after its whole evaluation: it waits
    less than half the large one's wall; both stay correct, and the turns alternate."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    (big, big_cand), (small, small_cand) = _tasks(tmp_path, BIG.replace("SIZE", "4096, 65536"),
                                                  BIG.replace("SIZE", "256, 4096"))

    async def go():
        a, b = await _two_engines()
        try:
            ended: dict[str, float] = {}
            phases: list[str] = []

            async def one(engine, task, cand, name, progress=None):
                ev = await engine.evaluate(task, cand, progress=progress)
                ended[name] = time.monotonic()
                return ev

            uuid = await a._gpu_key()
            assert uuid, "this GPU has no uuid: no machine-wide turn to share"
            first = asyncio.ensure_future(one(a, big, big_cand, "big", phases.append))
            # The large one holds the turn before the small one asks for it.
            await until_async(lambda: (gpu_lock.holder(gpu_lock.lock_path(uuid)) or {}).get("op") == "evaluate")
            small_ev = await one(b, small, small_cand, "small")
            big_ev = await first
            return big_ev, small_ev, ended, phases
        finally:
            await a.aclose()
            await b.aclose()

    big_ev, small_ev, ended, phases = asyncio.run(go())
    big_phases = big_ev.evidence["phases"]
    print(f"big: wall {big_ev.wall_seconds:.1f} s, verify {big_phases.get('verify_s', 0):.1f} s, "
          f"turns {big_ev.evidence.get('turns')}, handed over {big_ev.evidence.get('gpu_handed_over_s')} s; "
          f"small: wall {small_ev.wall_seconds:.1f} s, waited {small_ev.evidence.get('gpu_wait_s')} s, "
          f"turns {small_ev.evidence.get('turns')}; ended small-big {ended['small'] - ended['big']:+.1f} s")
    assert big_ev.verdict == small_ev.verdict == "correct", (big_ev.message, small_ev.message)
    went = [p for p in phases if p.startswith(("handed the GPU to", "lent the GPU to"))]
    assert went and went[0].endswith(("between two of verify's input sets; waiting for it back",
                                      "between verify and timing; waiting for it back",
                                      "between the early timing and torch.compile; waiting for it back",
                                      "while torch.compile compiles")), phases
    waited = [t for t in big_ev.evidence["turns"] if t["waited_s"] > 0]
    assert waited and waited[0]["stage"] in ("verify_set", "verify", "early_timing", protocol.TURN_CPU_END), \
        big_ev.evidence["turns"]  # the small one's turn
    # The small one waited for turns, not for the large one's evaluation. Which ends first is not
    # the rule: lent the GPU while the large one's torch.compile compiles, the small one runs its
    # verify then, and the large one may finish its timing while the small one's compile runs on CPU.
    assert big_ev.evidence["gpu_handed_over_s"] > 0, big_ev.evidence
    assert small_ev.evidence["gpu_wait_s"] < big_ev.wall_seconds / 2, (small_ev.evidence["gpu_wait_s"],
                                                                       big_ev.wall_seconds)
    for ev in (big_ev, small_ev):  # torch.compile compiled between the two CPU turn points, and ran
        stages = [t["stage"] for t in ev.evidence["turns"]]
        assert protocol.TURN_CPU_START in stages and protocol.TURN_CPU_END in stages, stages
        notes = ev.evidence.get("notes") or []
        assert ev.compiled is not None and not [n for n in notes if "without it failed" in n], notes


@pytest.mark.gpu
def test_on_a_gpu_a_small_task_that_said_its_need_gets_its_turn_beside_a_large_tasks_timing_inputs(tmp_path, lock_dir):
    """Six benches at once on an H200: the 6 GiB softmax held more than 1/8 of the card at its
    turn points, so it kept the GPU and the 64 MiB Tasks behind it waited 143-152 s. Verify now
    keeps nothing live between its sets (recompute), but the timing stages keep the timing inputs:
    an input of 1/7 of the card is more than 1/8 there. A small Task that queues once the large
    one's verdict is out, sized on meta while it waits (2.4 GiB), is let in at a timing-stage turn
    point (the lend around torch.compile's compile, or the one after the early timing) all the
    same; both stay correct."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    total = torch.cuda.get_device_properties(0).total_memory
    # A row sum over an input of 1/7 of the card (11.3 GiB on an H100, 20 GiB on an H200): its
    # float64 oracle (2.5x the input; a softmax's would be 7.5x) still fits on the GPU, so verify
    # takes seconds, and the timing input alone is more than 1/8 of the card.
    cols = total // 7 // 4 // 4096 // 1024 * 1024
    (big, big_cand), (small, small_cand) = _tasks(
        tmp_path, BIG.replace("torch.softmax(x, dim=-1)", "torch.sum(x, dim=-1)").replace("SIZE", f"4096, {cols}"),
        BIG.replace("SIZE", "4096, 4096"))  # 64 MiB

    async def go():
        a, b = await _two_engines()
        try:
            verdict_out = asyncio.Event()
            first = asyncio.ensure_future(a.evaluate(big, big_cand, early=lambda part: verdict_out.set()))
            await asyncio.wait_for(verdict_out.wait(), 500)
            small_ev = await b.evaluate(small, small_cand)
            big_ev = await first
            return big_ev, small_ev, b._needs
        finally:
            await a.aclose()
            await b.aclose()

    big_ev, small_ev, needs = asyncio.run(go())
    turns = big_ev.evidence.get("turns") or []
    print(f"big: wall {big_ev.wall_seconds:.1f} s, turns {turns}, handed over "
          f"{big_ev.evidence.get('gpu_handed_over_s')} s; small: wall {small_ev.wall_seconds:.1f} s, waited "
          f"{small_ev.evidence.get('gpu_wait_s')} s, need {list(needs.values())}")
    assert big_ev.verdict == small_ev.verdict == "correct", (big_ev.message, small_ev.message)
    assert list(needs.values()) == [(memory_plan.turn_need(64 << 20, 64 << 20, 0), 128 << 20)]
    let_in = [t for t in turns if t["released"] and t["held_gib"] * (1 << 30) > gpu_lock.HAND_OVER_MAX_HELD * total]
    assert let_in, turns  # the GPU went to the small one while more than the eighth was live
    assert let_in[0]["stage"] in ("early_timing", protocol.TURN_CPU_START, "torch_compile"), let_in


# The candidate's CPU span (fake_run's stand-in for torch.compile compiling the reference) waits,
# bounded, until another process waiting for the GPU has had it; its second stage then says
# whether that process was done with it (it wrote GONE as it let go) when the evaluation went on.
COMPILES = """
import os, time
def run():
    folder = os.path.join(os.environ["KERNEL_LSP_GPU_LOCK_DIR"], "GPU-fake.lock.waiters")
    t = time.time()
    while time.time() - t < 60 and not (os.path.isdir(folder) and [n for n in os.listdir(folder) if not n.startswith(".")]):
        time.sleep(0.02)
    return "began"
def compile_cpu():
    t = time.time()
    while time.time() - t < 60 and not os.path.exists(os.environ["HAD_IT"]):
        time.sleep(0.02)
def after_turn():
    return os.path.exists(os.environ["HAD_IT"]) and os.path.exists(os.environ["GONE"])
"""

# Waits for the GPU argv[1], writes argv[2] when it has it, holds it argv[3] seconds, writes argv[4].
GRAB_THEN_GO = """
import asyncio, sys
from kernel_lsp.engine.caller import gpu_lock

async def main():
    async with gpu_lock.gpu_turn(sys.argv[1], "evaluate"):
        open(sys.argv[2], "w").close()
        await asyncio.sleep(float(sys.argv[3]))
        open(sys.argv[4], "w").close()

asyncio.run(main())
"""


def test_the_gpu_is_lent_while_torch_compile_compiles_and_taken_back_before_the_gpu_work(tmp_path, lock_dir):
    """Between TURN_CPU_START and TURN_CPU_END the Worker compiles (CPU work): a process waiting for
    the GPU gets it meanwhile, and the evaluation goes on only once it has the GPU back. Without
    the lend the waiter would have the GPU only after the whole evaluation (its compile waits 60 s
    for HAD_IT, then "ran: False")."""
    from kernel_lsp.engine import Engine

    had_it, gone = tmp_path / "had_it", tmp_path / "gone"
    task = Task(name="t", reference_path=str(tmp_path / "t.py"), reference_source="x = 1\n")
    cand = Candidate(source=COMPILES, kind="python")
    env = {**FAKE, "HAD_IT": str(had_it), "GONE": str(gone), "KERNEL_LSP_GPU_LOCK_DIR": str(lock_dir)}

    async def go():
        engine = on_fake_gpu(Engine(timeout=60, warm=False, env=env, sandbox="off", prebuild=False))
        other_env = {k: v for k, v in _env().items() if k != "KERNEL_LSP_GPU_WAIT_S"}
        try:
            await engine.ping()
            phases: list[str] = []
            # The other process queues while the evaluation holds the GPU (the candidate's run()
            # waits for it); the candidate's stages have no verify turn point (fake_run).
            job = asyncio.ensure_future(engine.evaluate(task, cand, progress=phases.append))
            await until_async(lambda: job.done() or bool(gpu_lock.holder(gpu_lock.lock_path(KEY))))
            other = subprocess.Popen([sys.executable, "-c", GRAB_THEN_GO, KEY, str(had_it), "0.5", str(gone)],
                                     env=other_env)
            ev = await job
            assert other.wait(60) == 0
            return ev, phases, other.pid
        finally:
            await engine.aclose()

    ev, phases, pid = asyncio.run(go())
    assert ev.verdict == "correct" and ev.message == "ran: True", (ev.message, phases)
    stages = [t["stage"] for t in ev.evidence["turns"]]
    assert stages == [protocol.TURN_CPU_START, protocol.TURN_CPU_END], ev.evidence["turns"]
    lent = [p for p in phases if p.startswith("lent the GPU")]
    assert len(lent) == 1 and lent[0].startswith(f"lent the GPU to kernel-lsp pid {pid} ("), (phases, ev.evidence)
    assert lent[0].endswith(") while torch.compile compiles"), lent
    assert ev.evidence["gpu_handed_over_s"] > 0.2  # it waited for the other's 0.5 s turn to end


def test_nobody_waiting_the_compile_keeps_the_gpu(tmp_path, lock_dir):
    """Alone, the CPU span lends nothing: the evaluation never waits to get the GPU back."""
    from kernel_lsp.engine import Engine

    (tmp_path / "had_it").touch()
    (tmp_path / "gone").touch()
    task = Task(name="t", reference_path=str(tmp_path / "t.py"), reference_source="x = 1\n")
    cand = Candidate(source=COMPILES.replace('not (os.path.isdir(folder) and [n for n in os.listdir(folder) if not n.startswith(".")])', 'False'),
                     kind="python")
    env = {**FAKE, "HAD_IT": str(tmp_path / "had_it"), "GONE": str(tmp_path / "gone"),
           "KERNEL_LSP_GPU_LOCK_DIR": str(lock_dir)}

    async def go():
        engine = on_fake_gpu(Engine(timeout=60, warm=False, env=env, sandbox="off", prebuild=False))
        try:
            phases: list[str] = []
            return await engine.evaluate(task, cand, progress=phases.append), phases
        finally:
            await engine.aclose()

    ev, phases = asyncio.run(go())
    assert ev.verdict == "correct" and not [p for p in phases if "lent" in p or "handed" in p], phases
    assert "gpu_handed_over_s" not in (ev.evidence or {})
    assert [t["released"] for t in ev.evidence["turns"]] == [False, False]
