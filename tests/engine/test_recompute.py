"""The largest Tasks' sets kept nowhere (worker/judge/recompute.py): when the memory plan would copy
input sets and expected outputs to host memory, verify draws them again from their seed and
runs the reference again, after checking both repeat; every cheat is still caught that way. On the
CPU the plan is forced to "host" (a GPU decides it by size: tests/engine/test_gpu_verdicts_round2.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.worker.judge import memory_plan, recompute  # noqa: E402

from .test_cheats_cpu import evaluate  # noqa: E402

NOTE = "each set drawn again from its seed"


@pytest.fixture
def too_large(monkeypatch: pytest.MonkeyPatch) -> list[memory_plan.Plan]:
    """The plan a GPU makes for a set too large to keep on it: keep = "host"."""
    real = memory_plan.plan
    plans: list[memory_plan.Plan] = []

    def host_plan(*args: Any, **kw: Any) -> memory_plan.Plan:
        p = real(*args, **kw)
        p.keep = "host"
        p.notes.append(f"{memory_plan.HOST_NOTE} (forced by the test)")
        plans.append(p)
        return p

    monkeypatch.setattr(memory_plan, "plan", host_plan)
    # A few KiB copy in microseconds; a 6 GiB set takes seconds: copies as slow as the large ones.
    monkeypatch.setattr(recompute, "HOST_COPY_BYTES_PER_S", 1e3)
    return plans


def test_a_correct_candidate_is_judged_with_its_sets_recomputed(too_large) -> None:
    ev = evaluate("correct")
    assert ev.verdict == "correct", ev.message
    assert too_large, "the plan was not asked"
    assert ev.evidence["memory"]["keep"] == "recompute"
    notes = " ".join(ev.evidence["notes"])
    assert NOTE in notes and memory_plan.HOST_NOTE not in notes
    assert ev.accuracy["rule"] == "oracle"


@pytest.mark.parametrize("name,verdict", [
    ("mismatch", "mismatch"),
    ("nan_output", "nan"),
    ("unwritten", "unwritten_output"),
    ("mutate_input", "mutated_input"),
    ("cache_ptr", "stale_result"),
    ("cache_id", "stale_result"),
])
def test_every_cheat_is_still_caught_when_nothing_is_kept(too_large, name: str, verdict: str) -> None:
    ev = evaluate(name)
    assert ev.verdict == verdict, (ev.verdict, ev.message)
    assert ev.correct is False


def test_inputs_that_differ_for_one_seed_are_kept_on_the_host(too_large, monkeypatch) -> None:
    # get_inputs() that ignores the seed (the clock, os.urandom): a second draw cannot stand for
    # the first, so the sets are copied as before, and the note says why.
    import itertools

    from kernel_lsp.engine.worker import harness

    counter = itertools.count()
    real_draw = harness.Harness._draw

    def drifting(self: Any, seed: int) -> list[Any]:
        values = real_draw(self, seed)
        return [v + next(counter) if isinstance(v, torch.Tensor) else v for v in values]

    monkeypatch.setattr(harness.Harness, "_draw", drifting)
    ev = evaluate("correct")
    assert ev.evidence["memory"]["keep"] == "host"
    assert "kept in host memory, not drawn again: get_inputs() draws different values for the same seed" \
        in " ".join(ev.evidence["notes"])


def test_repeatable_refuses_a_reference_that_disagrees_with_itself_or_costs_more_than_a_copy() -> None:
    x = [torch.ones(4)]
    draw = lambda seed: [torch.ones(4)]  # noqa: E731
    same = lambda a, b: all(torch.equal(p, q) for p, q in zip(a, b))  # noqa: E731
    close = lambda a, b: torch.allclose(a, b)  # noqa: E731
    gib = 1 << 30  # a set whose host copy takes ~0.8 s
    ok, why = recompute.repeatable(draw, lambda v: v[0] * 2, 0, x, torch.full((4,), 2.0), same, close, gib)
    assert ok and why == ""
    ok, why = recompute.repeatable(draw, lambda v: torch.rand(4), 0, x, torch.full((4,), 2.0), same, close, gib)
    assert not ok and "disagree" in why
    ok, why = recompute.repeatable(lambda seed: [torch.zeros(4)], lambda v: v[0], 0, x, x[0], same, close, gib)
    assert not ok and "different values" in why
    # A reference slower than copying its set (16 bytes: any run is) is kept on the host.
    import time

    slow = lambda v: (time.sleep(0.01), v[0] * 2)[1]  # noqa: E731
    ok, why = recompute.repeatable(draw, slow, 0, x, torch.full((4,), 2.0), same, close, 16)
    assert not ok and "more than a host copy" in why


def test_recomputed_outputs_run_the_reference_at_each_access() -> None:
    calls: list[int] = []

    def of(seed: int) -> int:
        calls.append(seed)
        return seed * 10

    r = recompute.Recomputed(of)
    r.append(1)
    r.append(2)
    assert len(r) == 2 and r[0] == 10 and list(r) == [10, 20] and list(r.plus(3)) == [10, 20, 30]
    assert calls == [1, 1, 2, 1, 2, 3] and len(r) == 2

