"""What an op tells its caller before it answers (protocol.partial): the Worker's loop installs
a sender for the request it is serving, the run module calls `send`.

Only the Worker's own process sends (a candidate's forked child never writes on the protocol).
A candidate that imports this module and sends a made-up partial changes nothing that counts:
a partial is only shown until the answer replaces it, never stored, never used by the guard.
"""

from __future__ import annotations

import os
from typing import Any, Callable

Sender = Callable[[str, dict[str, Any]], None]

_current: list[tuple[int, Sender]] = []  # (the Worker's pid, the sender of the request served now)


def install(sender: Sender | None) -> None:
    """The Worker's loop: `sender` for the request being served; None once it is answered."""
    _current[:] = [(os.getpid(), sender)] if sender is not None else []


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
