"""One evaluation on a GPU at a time, machine-wide: a file lock per GPU (caller side, no torch).

Several kernel-lsp processes share a GPU (a CLI bench beside the editor's server, four benches
started at once): each Engine's own lock orders only its own requests, and two evaluations of
large Tasks at once can run the GPU out of memory, a verdict against a candidate that alone
fits. So the GPU phase of an evaluation (the Worker's requests in client.GPU_OPS: evaluate,
profile, extract and the torch.compile preparations) takes `gpu_turn(key)` first: an exclusive
`flock` on `<lock dir>/<GPU uuid>.lock`, where the lock dir is `$KERNEL_LSP_GPU_LOCK_DIR`, else
`<temp dir>/kernel-lsp-gpu-locks` (one per machine, not per cache folder, so processes with
different caches still take turns). The kernel drops the lock when its holder dies; nothing is
left to clean up.

The wait is polled from the event loop (never a blocked thread), shown through `progress`
with who holds the GPU, and bounded: past `wait_s` it raises GPUBusy (the evaluation could not
run, exit 2). The Worker's deadline starts once the turn is taken, so waiting is never a
candidate's timeout. Timings gain too: two evaluations timed at once slow each other.

Turns are bounded and taken in order of target. A waiter announces itself with a file in
`<lock>.waiters/` (named by its place in the queue and its pid, touched every second while it
waits, removed once it has the turn or gives up; a dead pid's file, or one not touched for
STALE_S, is passed over), and only the first live waiter tries the lock. Its place is its target:
when its evaluation started plus TARGET_FACTOR times what that evaluation would take alone (its own
work so far, every second it did not wait for the GPU, plus the GPU work it is expected to have
left: from its Task's sizes until it has been timed once, then from its early timing). So a small
Task that queues behind a large one goes first, and a newcomer, whose target grows with the
clock, is never starved. A holder whose evaluation reaches a safe point between its stages (a
turn point, protocol.YIELD_TURNS) asks `Turn.others_ahead()`: the waiters whose target comes
before its own, once this turn has lasted MIN_TURN_S. When there are any it `hand_over`s: it
queues at its target, lets the lock go, and takes it back when its place comes (the GPU is idle
at most one waiter's poll, POLL_S, in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import logging
import os
import re
import sys
import tempfile
import time
from typing import Any, AsyncIterator, Awaitable, Callable

log = logging.getLogger(__name__)

# How often a waiter tries the lock; a turn handed over costs at most this much idle GPU time.
POLL_S = 0.05
# Waiting longer than this for another process's evaluations is "could not run". Each holder's
# turn ends within its own deadline (120-300 s by default), so this lets a few queue ahead.
DEFAULT_WAIT_S = 900.0
# A waiter touches its file this often; one untouched for STALE_S is passed over (its process
# stopped waiting without removing it, or its event loop is stuck: it is not polling the lock).
HEARTBEAT_S = 1.0
STALE_S = 10.0


# A turn is handed over only when what the paused evaluations keep live on the GPU, all of them
# together, stays small: the process that gets the GPU then runs beside them, not beside their
# input sets. Four benches of a 6 GiB softmax at once on an H100 (2026-12-05): the other three held
# 67.7 GiB while paused at turn points, and the one with the turn ran out of memory at its first
# 6 GiB allocation, 4.85 GiB free of 79 (a verdict against a correct candidate), and the float64
# oracles, short of room, ran on the host CPU (37-191 s a verify instead of 2 s). Counted per
# evaluation at 1/8 of the card, the next run of those four benches was cut at 250 s with nothing
# printed: three paused holders of up to 9.9 GiB each leave the runner less than its oracle's
# 45 GiB beside the check's 24 GiB (worker/judge/memory_plan.py), so it goes to the host. So the sum
# counts: this evaluation's live data plus what every paused one holds (their markers in
# `<lock>.paused/`) at most 1/8 of the card (9.9 GiB of an H100, 17.6 GiB of an H200). One 6 GiB
# softmax may pause while another runs (room 79 - 6 - 24 = 49 GiB for the oracle on the H100), a
# second may not. The medium Tasks (64 MiB of inputs) hold well under 1 GiB at their turn points.
HAND_OVER_MAX_HELD = 1 / 8
# Above that share, the turn still goes to waiters that said what they need (`needs_bytes`, from
# their Task's sizes on the meta device: worker/judge/memory_plan.turn_need) when the paused data
# and the largest of those needs fit in this share of the card. Six benches at once on an H200
# (2026-12-05): the 6 GiB softmax kept the GPU through its whole evaluation (146 s, above 1/8 at
# every turn point) and the three 64 MiB Tasks queued behind it waited 143-152 s for 3-4 s of
# GPU work each (walls 167-175 s against 11-34 s alone). Such a Task needs 2.4 GiB; the softmax
# holds up to 22 GiB at its turn points: 24.4 GiB, inside 3/4 of an 80 GB H100. The last quarter is the
# margin for what the sizes do not see (the allocator's rounding, a library's workspace); a need
# that was too small still ends in the Worker's shared-OOM wait and retry (worker/run.py), not a
# wrong verdict. A waiter whose need is unknown (its Task did not run on meta, an older
# kernel-lsp) is handed the turn only under the 1/8 rule.
HAND_OVER_MAX_SHARED = 3 / 4

# The least GPU time a turn lasts before the holder hands it over at a turn point (lending it for
# CPU work is not held back). Without it, six benches at once on an H100 (2026-12-05, turns by
# virtual time, first queued plus GPU time had) let the GPU go after a few tenths of a second of
# a turn, between two of verify's input sets, and waited 4-8 s for it back, two to four times per
# evaluation; 3 s was chosen then by replaying those runs (benchmarks/turn_policy.py). Turns by
# target hand over only where a waiter's target comes first, which a holder's work does not move
# while within what it was expected to need. Replayed through this lock (2026-12-07d, scale 0.5,
# every bench sized before its turn; worst wall over alone wall of six benches, the latest profile
# first, then three older ones; benchmarks/results/gpu_runs/2026-12-07d/turn_policy_replay_*):
#   quantum   017e22b   ce5de6e   ba98854   d5ce317   (by virtual time, best quantum: 4.2, 3.3, 4.6, 5.9)
#   0 s       2.8       3.7       3.5       5.1
#   0.5 s     2.8       4.0       3.9       5.1
#   1 s       2.8       4.2       4.2       5.1
#   3 s       2.8       4.8       5.1       4.2
# 1 s: the latest profile (today's builds and stages) is within 3x at every quantum; a second
# still bounds how often two evaluations that both ran past what they were expected to need pass
# the turn back and forth (each hand-over frees the Worker's cached GPU memory).
MIN_TURN_S = 1.0

# The order of turns: earliest target first, the target being when an evaluation started plus
# TARGET_FACTOR times its expected alone time. Ordering by deadline keeps the worst lateness
# least; the factor is issue 33's bound (no bench past 3x its alone wall with six at once), so
# that evaluations started at different times compare as that bound does.
TARGET_FACTOR = 3.0
# The GPU work an evaluation is expected to have, before it has been timed: EXPECT_BASE_S plus
# EXPECT_S_PER_GIB per GiB of one input set and its outputs. From the H100 runs of
# first_bench.py alone (2026-12-07c): 2-128 MiB Tasks 1.8-2.1 s of evaluation (verify, the
# early timing, torch.compile, the final timing), the 6 GiB softmax (12 GiB with its outputs)
# 8.3 s. A Task whose candidate is slow (kahan_sum, 5.6 s for 32 MiB) is seen at its early timing.
EXPECT_BASE_S = 1.8
EXPECT_S_PER_GIB = 0.55
# After the early timing, what is left is torch.compile's GPU part and the final timing, which
# times the same functions (and torch.compile's) to the same budget: expected as long as the
# early timing was (the same runs: 0.5-1.6x of it on those H100 runs).
FINAL_PER_EARLY = 1.0
# The least expected work left, once an evaluation has run past what it was expected to take.
MIN_LEFT_S = 0.2


def expected_gpu_s(data_bytes: Any) -> float:
    """The GPU seconds an evaluation of a Task whose one input set and outputs take
    `data_bytes` is expected to have (EXPECT_BASE_S when unknown)."""
    if not isinstance(data_bytes, (int, float)) or data_bytes < 0:
        return EXPECT_BASE_S
    return EXPECT_BASE_S + EXPECT_S_PER_GIB * float(data_bytes) / (1 << 30)


def target_ns(origin_ns: int, own_s: float, left_s: float) -> int:
    """The place of an evaluation started at `origin_ns` (time.time_ns) that has worked `own_s`
    seconds (not waiting for the GPU) and is expected to need `left_s` more."""
    return origin_ns + int(TARGET_FACTOR * (max(0.0, own_s) + max(MIN_LEFT_S, left_s)) * 1e9)


def may_hand_over(held_bytes: Any, total_bytes: Any, paused_bytes: int = 0,
                  needs: list[Any] | None = None) -> bool:
    """May an evaluation paused with `held_bytes` live on a GPU of `total_bytes` let another
    process have it, while other paused evaluations hold `paused_bytes` there? `needs`: what each
    waiter that would go first said it needs (None where it did not say). Unknown sizes (a CPU, a
    Worker that did not say): yes."""
    if not isinstance(held_bytes, (int, float)) or not isinstance(total_bytes, (int, float)) or total_bytes <= 0:
        return True
    live = held_bytes + max(0, paused_bytes)
    if live <= HAND_OVER_MAX_HELD * total_bytes:
        return True
    if not needs or not all(isinstance(n, (int, float)) and n >= 0 for n in needs):
        return False
    return live + max(needs) <= HAND_OVER_MAX_SHARED * total_bytes


def needs_of(waiters: list[dict[str, Any]]) -> list[Any]:
    """What each waiter (others_waiting's entries) said it needs on the GPU; None where unsaid."""
    return [w.get("needs_bytes") for w in waiters]


class GPUBusy(Exception):
    """The GPU stayed held by other kernel-lsp evaluations past the wait: could not run."""


def lock_dir() -> str:
    return os.environ.get("KERNEL_LSP_GPU_LOCK_DIR") or os.path.join(tempfile.gettempdir(), "kernel-lsp-gpu-locks")


def lock_path(key: str) -> str:
    return os.path.join(lock_dir(), re.sub(r"[^\w.-]", "_", key)[:120] + ".lock")


def open_lock(path: str) -> int:
    """An fd on the lock file `path`, its folder made (shared by every user of the machine)."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o1777)  # shared by every user of the machine, like /tmp
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)
    return fd


def holder(path: str) -> dict[str, Any] | None:
    """What the process holding the lock wrote about itself (pid, command, since), if anything."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "another kernel-lsp process"
    held = time.time() - float(info.get("since") or time.time())
    return f"kernel-lsp pid {info.get('pid')} ({info.get('command', '?')}: {info.get('op', '?')}, for {held:.0f} s)"


class Turn:
    """The GPU's turn, held (what `gpu_turn` yields). `waited`: seconds waited to get it;
    `handed_s`: seconds spent without it after handing it over (`hand_over`)."""

    def __init__(self, key: str | None, fd: int | None = None, what: str = "", waited: float = 0.0,
                 wait_s: float = DEFAULT_WAIT_S, needs_bytes: int | None = None,
                 origin_ns: int | None = None, expect_s: float | None = None) -> None:
        self.key = key
        # What it said it needs (gpu_turn), said again each time it queues to get the turn back:
        # unsaid, a holder above the eighth would keep the turn from it until its whole evaluation ends.
        self.needs_bytes = needs_bytes
        self.fd = fd
        self.what = what
        self.waited = waited
        self.wait_s = wait_s
        self.handed_s = 0.0
        self.handovers = 0
        self.kept: list[dict[str, Any]] = []  # turn points where it was not handed over (may_hand_over)
        self.held = fd is not None  # False while handed over (and after a hand-over that failed)
        # When its evaluation started (before its build and its wait), for its target.
        self.origin_ns = origin_ns if origin_ns is not None else time.time_ns()
        self.served_s = 0.0             # GPU time it has had, up to its last hand-over
        self.got_at = time.monotonic()  # when it (last) took the turn
        self.left_s = expect_s if expect_s is not None else EXPECT_BASE_S  # GPU work expected ...
        self.left_from = 0.0            # ... from this much served on
        self.sized = expect_s is not None  # expected from its Task's sizes (else until it says them)
        self.early_from: float | None = None  # served when the early timing began (the "verify" point)
        self._paused: _Paused | None = None  # its marker while it is without the turn (hand_over, lend)

    def others_waiting(self) -> list[dict[str, Any]]:
        """The processes queued for this GPU, in queue order (empty without a lock)."""
        return others_waiting(self.key) if self.key and self.fd is not None else []

    def served(self) -> float:
        """The GPU time it has had (this turn's so far included)."""
        return self.served_s + (time.monotonic() - self.got_at if self.held else 0.0)

    def target(self) -> int:
        """Its place if it let the turn go now (target_ns): its own work is the time since its
        evaluation started less every wait for the GPU."""
        own = (time.time_ns() - self.origin_ns) / 1e9 - self.waited - self.handed_s
        return target_ns(self.origin_ns, own, self.left_s - (self.served() - self.left_from))

    def expect(self, left_s: float) -> None:
        """It is now expected to need `left_s` more seconds of GPU work."""
        self.left_s, self.left_from = left_s, self.served()

    def passed(self, stage: str, data_bytes: Any = None) -> None:
        """At the turn point after `stage`: what it learnt about the work left. `data_bytes`, its
        Task's data as the Worker drew it, when it queued unsized (alone on the GPU, it did not
        size its Task: a large one would otherwise pass as small until its early timing); the
        early timing tells how long the final one takes."""
        if not self.sized and isinstance(data_bytes, (int, float)) and data_bytes >= 0:
            self.sized = True
            self.expect(expected_gpu_s(data_bytes) - self.served())
        if stage == "verify":
            self.early_from = self.served()
        elif stage == "early_timing" and self.early_from is not None:
            self.expect(FINAL_PER_EARLY * (self.served() - self.early_from))

    def paused_bytes(self) -> int:
        """What the other evaluations paused on this GPU (handed over or lent) keep live on it, as
        they said at their turn point: what a process given the GPU now runs beside."""
        return paused_bytes(self.key) if self.key and self.fd is not None else 0

    def others_ahead(self) -> list[dict[str, Any]]:
        """The waiters that go first if it lets the turn go now: those whose target comes before its
        own (empty without a lock), and none before it has had `min_turn_s()` of this turn."""
        if not self.key or self.fd is None:
            return []
        if self.held and time.monotonic() - self.got_at < min_turn_s():
            return []
        return others_waiting_in(waiters_dir(self.key), before=_place(self.target()))

    def to_hand_over(self, stage: str, held_bytes: Any, total_bytes: Any,
                     data_bytes: Any = None) -> list[dict[str, Any]]:
        """At a turn point between two stages: the waiters it should let the GPU go to now, empty
        when it goes on (nobody ahead, or its live data with the paused evaluations' would stay on
        the GPU beside theirs: then recorded in `kept` and logged). What the point tells of the
        work left (`data_bytes`, the stage passed) is taken first (passed)."""
        self.passed(stage, data_bytes)
        ahead = self.others_ahead()
        if not ahead:
            return []
        paused = self.paused_bytes()
        if may_hand_over(held_bytes, total_bytes, paused, needs_of(ahead)):
            return ahead
        self.kept.append({"stage": stage, "held_bytes": held_bytes, "paused_bytes": paused})
        log.info("kept the GPU at %s: %.1f GiB of this evaluation and %.1f GiB of paused ones live on it", stage,
                 float(held_bytes or 0) / (1 << 30), paused / (1 << 30))
        return []

    def to_lend(self, held_bytes: Any, total_bytes: Any) -> bool:
        """Before a span of CPU work: whether to lend the GPU (somebody waits now, and its live
        data may stay on the GPU beside theirs). No quantum: the GPU would idle meanwhile."""
        waiting = self.others_waiting()
        return bool(waiting) and self.held and may_hand_over(held_bytes, total_bytes, self.paused_bytes(),
                                                             needs_of(waiting))

    async def hand_over(self, where: str = "", progress: Callable[[str], Awaitable[Any] | Any] | None = None,
                        held_bytes: Any = None) -> float:
        """Let the waiters ahead of it (others_ahead) have the GPU, then wait for it back, queued at
        its target, its `held_bytes` marked as paused meanwhile (paused_bytes). The seconds
        without the turn; 0 when nobody is ahead (it keeps the turn). Raises GPUBusy when it does
        not come back within the wait (the turn is then not held)."""
        others = self.others_ahead()
        if not others or not self.key or self.fd is None:
            return 0.0
        place = self.target()  # behind those ahead of it
        t0 = time.monotonic()
        self.served_s += t0 - self.got_at
        queued = _Waiter(self.key, self.what, place_ns=place, needs_bytes=self.needs_bytes)  # queued before it lets go
        try:
            self._pause(held_bytes)
            self.held = False
            unlock(self.fd)
            await tell(progress, f"handed the GPU to {describe(others[0])}{' ' + where if where else ''}; "
                                 "waiting for it back")
        except BaseException:
            queued.remove()
            self._unpause()
            raise
        return await self._back(queued, t0, None)

    async def lend(self, where: str = "", progress: Callable[[str], Awaitable[Any] | Any] | None = None,
                   held_bytes: Any = None) -> bool:
        """Let the GPU go for a span of CPU work (torch.compile's compile) when another process
        waits for it now: it is not queued meanwhile, and `take_back` queues it at its
        target. False (kept) when nobody waits, so that alone it never waits to get it back."""
        others = self.others_waiting()
        if not others or not self.key or self.fd is None or not self.held:
            return False
        self.served_s += time.monotonic() - self.got_at
        self._pause(held_bytes)
        self.held = False
        unlock(self.fd)
        await tell(progress, f"lent the GPU to {describe(others[0])}{' ' + where if where else ''}")
        return True

    async def take_back(self, progress: Callable[[str], Awaitable[Any] | Any] | None = None) -> float:
        """The GPU back after `lend`, queued at its target (before the waiters whose target comes
        after its own, behind the others): the seconds waited once its CPU work was done.
        Raises GPUBusy as `hand_over` does."""
        if self.held or not self.key or self.fd is None:
            return 0.0
        return await self._back(_Waiter(self.key, self.what, place_ns=self.target(), needs_bytes=self.needs_bytes),
                                time.monotonic(), progress)

    async def _back(self, queued: "_Waiter", t0: float,
                    progress: Callable[[str], Awaitable[Any] | Any] | None) -> float:
        """Wait in the queue as `queued` until the turn is its again; the seconds since `t0`."""
        assert self.key is not None and self.fd is not None
        try:
            await _acquire(self.fd, lock_path(self.key), queued, self.wait_s, t0, progress)
        finally:
            queued.remove()
            self._unpause()
        self.held = True
        self.got_at = time.monotonic()
        stamp(self.fd, self.what or "?")
        took = time.monotonic() - t0
        self.handed_s += took
        self.handovers += 1
        return took

    def _pause(self, held_bytes: Any) -> None:
        self._unpause()
        if self.key:
            self._paused = _Paused(self.key, held_bytes)

    def _unpause(self) -> None:
        if self._paused is not None:
            self._paused.remove()
            self._paused = None


@contextlib.asynccontextmanager
async def gpu_turn(key: str | None, what: str = "", wait_s: float | None = None,
                   progress: Callable[[str], Awaitable[Any] | Any] | None = None,
                   needs_bytes: int | None = None, origin_ns: int | None = None,
                   expect_s: float | None = None) -> AsyncIterator[Turn]:
    """Hold the GPU `key` (its uuid) for the block; yields the Turn (`.waited`: the seconds
    waited). `key` None: no lock (CPU work, or a GPU without a uuid). `needs_bytes`: what this
    evaluation needs on the GPU, said to the holder while it waits (may_hand_over). Its place is
    its target (target_ns): `origin_ns`, when its evaluation started (default now), and
    `expect_s`, its expected GPU work (None: unsized, EXPECT_BASE_S until it says its data at a
    turn point, Turn.passed)."""
    if not key:
        yield Turn(None)
        return
    if wait_s is None:
        wait_s = float(os.environ.get("KERNEL_LSP_GPU_WAIT_S") or DEFAULT_WAIT_S)
    path = lock_path(key)
    fd = await asyncio.to_thread(open_lock, path)
    t0 = time.monotonic()
    now = time.time_ns()
    origin = now if origin_ns is None or origin_ns > now else origin_ns
    expect = EXPECT_BASE_S if expect_s is None else expect_s
    try:
        queued = _Waiter(key, what, place_ns=target_ns(origin, (now - origin) / 1e9, expect), needs_bytes=needs_bytes)
        try:
            await _acquire(fd, path, queued, wait_s, t0, progress)
        finally:
            queued.remove()
        async with _holding(Turn(key, fd, what, time.monotonic() - t0, wait_s, needs_bytes, origin, expect_s)) as turn:
            yield turn
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def _holding(turn: Turn) -> AsyncIterator[Turn]:
    """A lock just taken on `turn.fd`: stamped with who holds it, let go after the block."""
    assert turn.fd is not None
    stamp(turn.fd, turn.what or "?")
    try:
        yield turn
    finally:
        turn._unpause()  # ended while lent or handed over (cancelled): it holds nothing any more
        if turn.held:  # (a stamp cleared while not held would be the next holder's)
            unlock(turn.fd)


@contextlib.asynccontextmanager
async def gpu_turn_if_free(key: str | None, what: str = "") -> AsyncIterator[Turn | None]:
    """The GPU `key` for the block if nobody holds it or waits for it now, else None at once (no
    queueing): for advisory work that is worth doing only on an idle GPU. `key` None: no lock."""
    if not key:
        yield Turn(None)
        return
    if others_waiting(key):
        yield None
        return
    fd = await asyncio.to_thread(open_lock, lock_path(key))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        async with _holding(Turn(key, fd, what)) as turn:
            yield turn
    finally:
        os.close(fd)


async def _acquire(fd: int, path: str, queued: "_Waiter", wait_s: float, t0: float,
                   progress: Callable[[str], Awaitable[Any] | Any] | None) -> None:
    """Take the lock on `fd` once `queued` is the first live waiter (the earliest target)
    and the holder lets go; GPUBusy past `wait_s` from `t0`."""
    told = False
    while True:
        if queued.first():
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
        waited = time.monotonic() - t0
        if waited > wait_s:
            raise GPUBusy(f"the GPU stayed busy with {describe(holder(path))} for more than {wait_s:.0f} s "
                          "(kernel-lsp runs one evaluation per GPU at a time)")
        if not told and progress is not None:
            told = True
            ahead = holder(path) or next(iter(others_waiting_in(queued.folder, but=queued.name)), None)
            await tell(progress, f"waiting for the GPU: {describe(ahead)} is using it")
        queued.beat()
        await asyncio.sleep(POLL_S)


# -- the queue of waiters ------------------------------------------------------------------------

_seq = itertools.count(1)


def waiters_dir(key: str) -> str:
    return lock_path(key) + ".waiters"


def _place(ns: int) -> str:
    return f"{ns:020d}"


class _Waiter:
    """This process's place in the queue for a GPU: a file in `waiters_dir(key)` named
    `<place, ns>-<pid>-<n>` (so names sort by place: its target, target_ns; an older kernel-lsp's
    place is when it queued) holding who waits (for `describe`)."""

    def __init__(self, key: str, what: str, place_ns: int | None = None, needs_bytes: int | None = None) -> None:
        self.folder = waiters_dir(key)
        self.place_ns = time.time_ns() if place_ns is None else place_ns
        self.name = f"{_place(self.place_ns)}-{os.getpid()}-{next(_seq)}"
        self.path = os.path.join(self.folder, self.name)
        self._beat = time.monotonic()
        # Not written: this process waits unseen (and tries the lock always).
        info: dict[str, Any] = {"pid": os.getpid(), "op": what or "?", "command": _command(), "since": time.time()}
        if isinstance(needs_bytes, int) and needs_bytes >= 0:
            info["needs_bytes"] = needs_bytes  # what a holder above HAND_OVER_MAX_HELD reads (may_hand_over)
        self.path = _publish(self.folder, self.name, info)

    def first(self) -> bool:
        """No live waiter queued before this one."""
        if not self.path:
            return True
        for name, _pid in _queue(self.folder):
            return name >= self.name
        return True

    def beat(self) -> None:
        if self.path and time.monotonic() - self._beat >= HEARTBEAT_S:
            self._beat = time.monotonic()
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def remove(self) -> None:
        self.path = _unpublish(self.path)


def paused_dir(key: str) -> str:
    return lock_path(key) + ".paused"


class _Paused:
    """An evaluation without the turn in the middle of its work (handed over or lent): a file in
    `paused_dir(key)` named `<pid>-<n>` holding what it keeps live on the GPU meanwhile, so that a
    holder deciding whether to pause too counts it (may_hand_over). A dead pid's file is passed over."""

    def __init__(self, key: str, held_bytes: Any) -> None:
        held = int(held_bytes) if isinstance(held_bytes, (int, float)) and held_bytes > 0 else 0
        # Not written: unseen, the others decide as if it held nothing.
        self.path = _publish(paused_dir(key), f"{os.getpid()}-{next(_seq)}", {"pid": os.getpid(), "held_bytes": held})

    def remove(self) -> None:
        self.path = _unpublish(self.path)


def _publish(folder: str, name: str, data: dict[str, Any]) -> str:
    """Write `data` as the entry `name` of a shared folder, whole at once (written under a "."
    name, which is not an entry, then renamed): its path, or "" when it could not be written."""
    path = os.path.join(folder, name)
    try:
        _make_shared(folder)
        tmp = os.path.join(folder, "." + name)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.chmod(tmp, 0o666)
        os.replace(tmp, path)
    except OSError:
        return ""
    return path


def _unpublish(path: str) -> str:
    """Remove an entry `_publish` wrote (none: ""); "" for the caller's path."""
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return ""


def paused_bytes(key: str | None) -> int:
    """The bytes the live paused evaluations on GPU `key` keep there (their markers' sum); a dead
    pid's marker is removed."""
    if not key:
        return 0
    folder = paused_dir(key)
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    total = 0
    for name in names:
        parts = name.split("-")
        if name.startswith(".") or len(parts) != 2 or not parts[0].isdigit():
            continue
        path = os.path.join(folder, name)
        if not _alive(int(parts[0])):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                held = json.load(fh).get("held_bytes")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(held, (int, float)) and held > 0:
            total += int(held)
    return total


def _make_shared(folder: str) -> None:
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o1777)  # shared by every user of the machine, like /tmp


def _queue(folder: str) -> list[tuple[str, int]]:
    """(name, pid) of the live waiters' files, oldest first: a dead pid's file, or one not
    touched for STALE_S, is passed over (and a dead pid's removed)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    now = time.time()
    out = []
    for name in sorted(names):
        parts = name.split("-")
        if name.startswith(".") or len(parts) != 3 or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        path = os.path.join(folder, name)
        if not _alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        try:
            if now - os.stat(path).st_mtime > STALE_S:
                continue
        except OSError:
            continue  # removed meanwhile: it has the turn or gave up
        out.append((name, pid))
    return out


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def busy(key: str | None) -> bool:
    """Someone holds the GPU `key`'s turn or waits for it now: a new evaluation will queue."""
    if not key:
        return False
    if others_waiting(key):
        return True
    try:
        fd = os.open(lock_path(key), os.O_RDONLY)
    except OSError:
        return False  # no lock file: nobody ever took it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (closing drops the shared lock just taken)
    return False


def others_waiting(key: str | None) -> list[dict[str, Any]]:
    """Who waits for the GPU `key`'s turn, oldest first: each waiter's pid, op, command and
    since (what `describe` reads). This process's own waiters are listed too (another Engine
    of it may wait for the same GPU); a holder has no waiter file of its own."""
    return others_waiting_in(waiters_dir(key)) if key else []


def others_waiting_in(folder: str, but: str | None = None, before: str | None = None) -> list[dict[str, Any]]:
    """The live waiters in `folder`, in queue order; `but` left out; with `before`, only those whose
    place sorts before it."""
    out = []
    for name, pid in _queue(folder):
        if name == but:
            continue
        if before is not None and name >= before:
            break
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                info = json.load(fh)
        except (OSError, ValueError):
            continue
        out.append(info if isinstance(info, dict) else {"pid": pid})
    return out


async def tell(callback: Callable[[Any], Awaitable[Any] | Any] | None, what: Any) -> None:
    """A waiter's announcement (sync or async): what it raises must not stop the wait."""
    if callback is None:
        return
    with contextlib.suppress(Exception):
        out = callback(what)
        if asyncio.iscoroutine(out):
            await out


def stamp(fd: int, what: str) -> None:
    """Write who holds the lock (read by `holder`) into the file of `fd`, which holds it."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "op": what, "command": _command(),
                                  "since": time.time()}).encode(), 0)


def unlock(fd: int) -> None:
    """Clear the stamp, then let the lock go (the fd stays open)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)


def _command() -> str:
    argv = [os.path.basename(a) for a in sys.argv[:3]]
    return " ".join(argv) or "python"


def min_turn_s() -> float:
    """MIN_TURN_S, or $KERNEL_LSP_GPU_MIN_TURN_S (seconds, >= 0) where set."""
    raw = os.environ.get("KERNEL_LSP_GPU_MIN_TURN_S", "").strip()
    try:
        return max(0.0, float(raw)) if raw else MIN_TURN_S
    except ValueError:
        return MIN_TURN_S


def enabled() -> bool:
    """$KERNEL_LSP_GPU_LOCK=0 turns the machine-wide turn off (each process then uses the GPU
    as it likes, as before)."""
    return os.environ.get("KERNEL_LSP_GPU_LOCK", "1").strip().lower() not in ("0", "false", "no", "off")
