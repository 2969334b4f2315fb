"""What an op tells its caller before it answers (protocol.partial): the Worker's loop installs
a sender for the request it is serving, the run module calls `send`; and the request's turn
points (`turn_point`), where the Worker waits for its caller's word to go on.

Only the Worker's own process sends (a candidate's forked child never writes on the protocol).
A candidate that imports this module and sends a made-up partial changes nothing that counts:
a partial is only shown until the answer replaces it, never stored, never used by the guard. A
made-up turn point costs only time: the caller may hand the GPU over and then says go on, and
a continue line nobody waits for is skipped.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Any, Callable

from kernel_lsp.engine import protocol

Sender = Callable[[str, dict[str, Any]], None]
Reader = Callable[[], bytes]  # one line of the Worker's protocol input (b"" once the caller is gone)

# (the Worker's pid, the sender of the request served now, its input's reader when it asked for
# turn points (protocol.YIELD_TURNS), else None)
_current: list[tuple[int, Sender, Reader | None]] = []
_turns = itertools.count(1)
_paused: list[float] = [0.0]  # seconds this request waited at its turn points
_taken: list[dict[str, Any]] = []  # ... and where: {"stage", "waited_s"} per turn point
_data: list[int | None] = [None]  # one input set and its outputs, in bytes, once verify has drawn one


def install(sender: Sender | None, turns: Reader | None = None) -> None:
    """The Worker's loop: `sender` for the request being served (and `turns`, the reader of its
    input, when it asked for turn points); None once it is answered."""
    _current[:] = [(os.getpid(), sender, turns)] if sender is not None else []
    _paused[0] = 0.0
    _taken.clear()
    _data[0] = None


def data_size(nbytes: int) -> None:
    """The Task's data (one input set and its outputs), said at each later turn point: from it the
    caller expects this evaluation's GPU work when it did not size the Task before its turn
    (caller/gpu_lock.expected_gpu_s)."""
    _data[0] = int(nbytes) if nbytes >= 0 else None


def active() -> bool:
    """A request being served asked for partial results (worth the work of making one)."""
    return bool(_current) and _current[0][0] == os.getpid()


def send(kind: str, data: dict[str, Any]) -> bool:
    """Send a partial result of the request being served; False when none can go (no request
    asked, a forked child, a pipe that failed: the answer then says it all)."""
    if not active():
        return False
    try:
        _current[0][1](kind, data)
    except (OSError, TypeError, ValueError):
        return False
    return True


def paused_s() -> float:
    """Seconds the request being served has waited at its turn points (not its own time)."""
    return _paused[0]


def turns_taken() -> list[dict[str, Any]]:
    """The request's turn points so far: {"stage", "waited_s", "released"} each, in order
    (`released`: the caller handed the GPU over there, and the cached memory went back)."""
    return [dict(t) for t in _taken]


def turns_asked() -> bool:
    """The request being served asked for turn points (YIELD_TURNS): its caller holds the turn."""
    return active() and _current[0][2] is not None


def turn_point(stage: str) -> float | None:
    """A safe point between an evaluation's stages: when the request asked (YIELD_TURNS), tell
    the caller (a TURN_POINT partial naming `stage`) and wait for its continue line, during which
    the caller may let another process use the GPU. The seconds waited; None when not asked.
    Call it only between stages, outside a timing run and outside a tamper-check window (the
    candidate must not be running); run.py's `_turn_point` also checks the trusted functions
    after the wait."""
    if not turns_asked():
        return None
    read = _current[0][2]
    turn = next(_turns)
    t0 = time.perf_counter()
    held = gpu_held()
    sized = {"data_bytes": _data[0]} if _data[0] is not None else {}
    if not send(protocol.PARTIAL_TURN_POINT, {"stage": stage, "turn": turn, **held, **sized}):
        return None
    released = False
    while True:
        line = read()
        if not line:
            os._exit(0)  # the caller went away mid-request: nobody is left to answer
        try:
            message = protocol.decode(line)
        except ValueError:
            message = {}
        if protocol.is_release(message):
            if message.get("turn") == turn and not released:
                released = True
                release_gpu_memory()
            continue
        if protocol.is_resume(message) and message.get("turn") not in (None, turn):
            print(f"kernel-lsp worker: skipped a stale continue line at {stage}: {line[:200]!r}", file=sys.stderr)
            continue
        if not protocol.is_resume(message):
            # The caller never sends anything else here; going on is better than waiting for
            # a line that will not come (the deadline would end this Worker).
            print(f"kernel-lsp worker: expected a continue line at {stage}, got {line[:200]!r}; going on",
                  file=sys.stderr)
        waited = time.perf_counter() - t0
        _paused[0] += waited
        _taken.append({"stage": stage, "waited_s": round(waited, 3), "released": released,
                       **({"held_gib": round(held["held_bytes"] / (1 << 30), 2)} if "held_bytes" in held else {})})
        return waited


def gpu_held() -> dict[str, int]:
    """What this Worker keeps live on its GPU while it waits at a turn point (allocated tensors,
    not the allocator's cache, which goes back on release) and the card's size: the caller hands
    the turn over only when it is small (caller/gpu_lock.may_hand_over). Empty on a CPU."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return {}
        dev = torch.cuda.current_device()
        return {"held_bytes": int(torch.cuda.memory_allocated(dev)),
                "total_bytes": int(torch.cuda.get_device_properties(dev).total_memory)}
    except Exception:  # noqa: BLE001 - unknown: the caller decides as before
        return {}


def release_gpu_memory() -> None:
    """The GPU goes to another process while this request waits: hand back the cached blocks
    (freed tensors the allocator keeps), so that its evaluation does not run out of memory
    beside this one. Live tensors (the model, the timing inputs) stay."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - a broken context is the next stage's to report
        print(f"kernel-lsp worker: releasing GPU memory at a turn point: {exc!r}", file=sys.stderr)
