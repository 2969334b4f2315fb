"""A stand-in for kernel_lsp.engine.worker.run, loaded by the Worker through
$KERNEL_LSP_RUN_MODULE: it loads the candidate with the real builder and calls its
``run()``, so the client's fault handling is tested on real candidate code."""

from __future__ import annotations

from typing import Any

from kernel_lsp.engine import protocol
from kernel_lsp.engine.worker import notify
from kernel_lsp.model import Candidate, Evaluation, Task, Timing


def evaluate(task: Task, candidate: Candidate, checks: list[str], options: dict[str, Any], builder: Any) -> Evaluation:
    module, compiled = builder.load_python(candidate.source, "candidate.py")
    ev = Evaluation(task=task.name, candidate=candidate.id, compile=compiled)
    if module is None:
        ev.verdict, ev.message = "compile_error", "the candidate did not load"
        return ev
    try:
        value = module.run() if hasattr(module, "run") else None
        # A turn point between two stages, as the real run module's after verify (only when the
        # request asked, protocol.YIELD_TURNS); a candidate's `after_turn` is its second stage.
        if hasattr(module, "compile_cpu"):  # CPU work between the two turn points the real
            waited = notify.turn_point(protocol.TURN_CPU_START)  # torch.compile baseline has around it
            try:
                module.compile_cpu()
            finally:
                notify.turn_point(protocol.TURN_CPU_END)
        else:
            waited = notify.turn_point("verify")
        if hasattr(module, "after_turn"):
            value = module.after_turn()
    except RuntimeError as exc:  # like CHECK's harness: a raised error is an "error" Evaluation
        if type(exc).__name__.endswith("OutOfMemoryError"):
            raise  # the client maps it to "oom"
        ev.verdict, ev.message = "error", str(exc)
        return ev
    ev.verdict, ev.correct = "correct", True
    if waited is not None:
        ev.evidence = {"turns": notify.turns_taken()}
    ev.message = f"ran: {value!r}"
    ev.time = Timing(median_ms=1.0, min_ms=0.9, max_ms=1.1, spread_pct=1.0, runs=5)
    ev.eager = Timing(median_ms=2.0, min_ms=1.9, max_ms=2.1, spread_pct=1.0, runs=5)
    if options.get("early_result") and notify.active():
        # Asked for (early_result): the partial the real run module sends, then the rest.
        part = Evaluation.from_dict({**ev.to_dict(), "compiled_pending": True, "message": f"early: {value!r}"})
        notify.send("evaluation", part.to_dict())
        ev.evidence = {**(ev.evidence or {}), "early_result": {"sent": True}}
        ev.compiled = Timing(median_ms=1.5, min_ms=1.4, max_ms=1.6, spread_pct=1.0, runs=5)  # came after it
    return ev


def device_info() -> dict[str, Any]:
    return {"name": "fake", "capability": [9, 0]}
