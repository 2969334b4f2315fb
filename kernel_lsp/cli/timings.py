"""`kernel-lsp bench --timings`: where the seconds of a command go, phase by phase.

The caller's phases are stamped here (interpreter start to the command's first line, reading
the Tasks, opening the store, starting and warming the Worker, each evaluation's steps as the
Engine reports them); the Worker's own phases (loading the reference, the candidate's build,
verify, torch.compile, timing) come back on each Evaluation (`evidence["phases"]`).
"""

from __future__ import annotations

import os
import time
from typing import Any, TextIO


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of the whole line: starttime, in clock ticks since boot
        with open("/proc/uptime", encoding="utf-8") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """Named spans in the order they ran; `begin(name)` closes the span under way and opens `name`.
    With `live`, each span is also written there as it opens ("kernel-lsp --timings: 12.3 s:
    relu.py: evaluating"): a command cut short, or a long one, still says where it is."""

    def __init__(self, live: TextIO | None = None) -> None:
        self.live = live
        age = process_age_s()
        self.t0 = time.monotonic()
        self.rows: list[tuple[str, float]] = []
        if age is not None:
            self.rows.append(("interpreter start and imports", age))
        self._last = self.t0
        self._open: str | None = "reading the Tasks"
        self._age0 = age or 0.0  # the rows' total counts from the interpreter's start
        self.marks: list[tuple[str, float]] = []  # moments (the early result), seconds from the start

    def begin(self, name: str | None) -> None:
        """Close the span under way (under its name) and open `name`."""
        now = time.monotonic()
        if self._open is not None or now - self._last > 0.001:
            self.rows.append((self._open or "other", now - self._last))
        self._last, self._open = now, name
        if name is not None and self.live is not None:
            try:
                print(f"kernel-lsp --timings: {self._age0 + now - self.t0:.1f} s: {name}", file=self.live, flush=True)
            except (OSError, ValueError):  # a closed or broken stderr: the table at the end still tells
                self.live = None

    def rename(self, name: str) -> None:
        """Name the span under way ``name`` (what it turned out to be)."""
        self._open = name

    def mark(self, name: str) -> None:
        """A moment, not a span: when something came, in seconds from the command's start."""
        self.marks.append((name, self._age0 + time.monotonic() - self.t0))

    def end(self) -> None:
        self.begin(None)

    def add(self, name: str, seconds: float) -> None:
        """A span measured elsewhere (the Worker's): shown indented, not added to the total."""
        self.rows.append((f"  {name}", seconds))

    def total(self) -> float:
        return sum(s for n, s in self.rows if not n.startswith("  "))

    def to_dict(self) -> dict[str, Any]:
        return {"phases": [{"phase": n.strip(), "seconds": round(s, 4), "inside": n.startswith("  ")}
                           for n, s in self.rows], "total_s": round(self.total(), 4),
                "marks": [{"mark": n, "at_s": round(s, 4)} for n, s in self.marks]}

    def print(self, out: TextIO) -> None:
        width = max((len(n) for n, _ in self.rows), default=10)
        print("kernel-lsp bench --timings (seconds; indented: inside the Worker's evaluate)", file=out)
        for name, s in self.rows:
            print(f"  {name:<{width}}  {s:7.3f}", file=out)
        print(f"  {'total':<{width}}  {self.total():7.3f}", file=out)
        for name, s in self.marks:
            print(f"  {name}: at {s:.3f} s from the start", file=out)


def progress_stamper(phases: Phases, label: str):
    """A progress callback for Engine.evaluate: each step it reports opens a span."""
    def stamp(step: str, *rest: Any) -> None:
        phases.begin(f"{label}: {step}")
    return stamp


# Build steps whose key says too little on its own.
STEP_LABELS = {"pch_wait": "waiting for the precompiled headers another process makes"}


def worker_phases(phases: Phases, ev: Any) -> None:
    evidence = getattr(ev, "evidence", None) or {}
    # The candidate's build, step by step (device unit, host units, link, load; pool_s or worker_s:
    # the whole build where it ran): what the "compiling" span above was made of.
    for name, seconds in (evidence.get("build_steps") or {}).items():
        if isinstance(seconds, (int, float)):
            label = STEP_LABELS.get(name) or name.removesuffix("_s").replace("_", " ")
            phases.add("build: " + label, float(seconds))
    inside = evidence.get("phases") or {}
    for name, seconds in inside.items():
        if isinstance(seconds, (int, float)):
            phases.add(name.removesuffix("_s").replace("_", " "), float(seconds))
