"""A small fake engine for unit tests of the Search policy ONLY (the end-to-end tests
use the real Engine). A candidate's source says what evaluating it gives:

    # verdict: mismatch        (default: correct)
    # ms: 2.5                  (default: 10.0)
    # spread: 1.0              (percent; default 0.5)
    # flags: torch_fallback     (as the engine: also custom_kernel False, a PyTorch rewrite)
    # rewrite                  (custom_kernel False without a flag; default True)
    # compiled: 3.0            (the torch.compile baseline's ms; default none)
    # hang                     (sleeps until cancelled)
The start is re-timed like any other candidate; `ms@2: 9` overrides the 2nd evaluation.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from kernel_lsp.model import Candidate, CompileResult, Diagnostic, Evaluation, Span, Task, Timing


def timing(ms: float, spread: float = 0.5) -> Timing:
    return Timing(median_ms=ms, min_ms=ms * 0.98, max_ms=ms * 1.02, spread_pct=spread, runs=20)


class FakeEngine:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[str] = []
        self.prebuilt: list[str] = []
        self.profiled: list[str] = []
        self.counts: dict[str, int] = {}
        self.options: list[dict[str, Any] | None] = []

    async def device_info(self) -> dict[str, Any]:
        return {"name": "FakeGPU", "sm_count": 132, "capability": "9.0", "memory_bandwidth_gbps": 4800}

    async def prebuild(self, task: Task, candidate: Candidate) -> None:
        self.prebuilt.append(candidate.id)

    async def profile(self, task: Task, candidate: Candidate | None = None) -> dict[str, Any]:
        self.profiled.append(candidate.id if candidate else "")
        return {"hot_ops": [{"name": "fake_kernel", "pct": 97.0}]}

    async def evaluate(self, task: Task, candidate: Candidate, checks: tuple[str, ...] = (),
                       progress: Any = None, timeout: float | None = None,
                       options: dict[str, Any] | None = None) -> Evaluation:
        self.calls.append(candidate.id)
        self.options.append(options)
        n = self.counts[candidate.id] = self.counts.get(candidate.id, 0) + 1
        src = candidate.source
        if self.delay:
            await asyncio.sleep(self.delay)
        if "# hang" in src:
            await asyncio.sleep(3600)

        def field(name: str, default: str) -> str:
            m = re.search(rf"#\s*{name}@{n}:\s*(\S+)", src) or re.search(rf"#\s*{name}:\s*(\S+)", src)
            return m.group(1) if m else default

        verdict = field("verdict", "correct")
        if verdict == "compile_error":
            comp = CompileResult(ok=False, log="error: expected ';'", diagnostics=[
                Diagnostic(span=Span(3, 0, 3, 5), severity="error", message="expected ';'")])
            return Evaluation(task=task.name, candidate=candidate.id, verdict=verdict, correct=None,
                              message="did not build", compile=comp)
        if tuple(checks) == ("compile",):  # a compile-only evaluation: built, nothing ran
            return Evaluation(task=task.name, candidate=candidate.id, verdict="not_run", message="built",
                              compile=CompileResult(ok=True))
        if verdict == "not_run":  # what the engine says on a machine without a GPU
            from kernel_lsp.verdicts import NO_GPU

            return Evaluation(task=task.name, candidate=candidate.id, verdict=verdict, correct=None,
                              message=f"built; {NO_GPU}")
        if verdict != "correct":
            return Evaluation(task=task.name, candidate=candidate.id, verdict=verdict, correct=False,
                              message=f"fake {verdict}", evidence={"max_abs_err": 1.5})
        flags = [f for f in field("flags", "").split(",") if f]
        compiled = field("compiled", "")
        return Evaluation(task=task.name, candidate=candidate.id, verdict="correct", correct=True,
                          flags=flags, time=timing(float(field("ms", "10.0")), float(field("spread", "0.5"))),
                          eager=timing(10.0), compiled=timing(float(compiled)) if compiled else None,
                          custom_kernel=not ("torch_fallback" in flags or "# rewrite" in src))
