"""A cache hit is a fact to check, not a time: inside `no_process_started()` any attempt to start
a process (nvcc, ptxas, a compiler; subprocess.run and asyncio's subprocesses alike go through
subprocess.Popen) fails the test."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Iterator


class ProcessStarted(AssertionError):
    pass


@contextlib.contextmanager
def no_process_started() -> Iterator[list[list[str]]]:
    tried: list[list[str]] = []
    real = subprocess.Popen

    class Refused(real):  # type: ignore[misc, valid-type]
        def __init__(self, args, *rest, **kw):
            tried.append(list(args) if isinstance(args, (list, tuple)) else [str(args)])
            raise ProcessStarted(f"a cache hit started a process: {tried[-1]}")

    subprocess.Popen = Refused  # type: ignore[misc]
    try:
        yield tried
    finally:
        subprocess.Popen = real  # type: ignore[misc]
    assert not tried, f"a cache hit started processes: {tried}"
