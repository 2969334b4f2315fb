"""The Search's policy (selection, repair, guard, budget, cancel) over a fake engine and the
real Store. End-to-end Searches with the real Engine live in test_search_e2e.py."""

import asyncio
import time

import pytest

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.proposer import Proposal, ProposalRequest
from kernel_lsp.agent.search import Search, SearchOptions
from kernel_lsp.model import Candidate, Task
from kernel_lsp.store import Store

from .fakes import FakeEngine

TASK = Task(name="fake", reference_path="fake.py", reference_source="class Model: ...")
START = Candidate(source="class ModelNew: ...\n# ms: 10\n", kind="python")


class Scripted:
    """Answers each propose() call with the next scripted list of sources / failures."""

    name = "scripted"
    model = None
    can_repair = True
    uses_profile = True

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[ProposalRequest] = []

    async def propose(self, request):
        self.requests.append(request)
        if not self.script:
            return []
        out = []
        for item in self.script.pop(0):
            if isinstance(item, Proposal):
                out.append(item)
            else:
                out.append(Proposal(candidate=Candidate(source=f"class ModelNew: ...\n{item}\n",
                                                        kind="python", origin="llm",
                                                        parent=request.parent.id, note=item),
                                    prompt_tokens=100, completion_tokens=50, cost=0.001))
        return out

    async def aclose(self):
        pass


async def go(tmp_path, script, engine=None, **opts):
    store = Store(tmp_path / "s.sqlite")
    budget = opts.pop("budget", Budget(proposals=20, patience=3))
    # The fake engine reads `# ms:` comments: sources differing only there are not near-duplicates here.
    opts.setdefault("near_duplicates", False)
    proposer = Scripted(script)
    events = []
    search = Search(engine or FakeEngine(), store, TASK, START, proposer,
                    SearchOptions(budget=budget, **opts))
    result = await search.run(events.append)
    return result, store, proposer, events


async def test_guard_picks_fastest_correct_never_wrong_or_slower(tmp_path):
    result, store, _, events = await go(tmp_path, [
        ["# ms: 12  slower", "# verdict: mismatch\n# ms: 1  wrong but fast"],
        ["# ms: 1.5 flagged\n# flags: timer_patch", "# ms: 5  faster"],
    ])
    assert result.improved and result.confirmed
    assert "# ms: 5" in result.best.source
    assert result.speedup == pytest.approx(2.0)
    rows = store.search(result.search_id)
    assert rows["state"] == "done" and rows["best"] == result.best.id
    assert rows["budget"]["result"]["improved"] is True
    assert len(rows["nodes"]) == 5  # root + 4 children, every one kept
    kinds = [e.kind for e in events]
    assert kinds[0] == "started" and "new_best" in kinds and kinds[-1] == "finished"
    assert result.tokens == 600 and result.cost == pytest.approx(0.004)


async def test_noise_sized_gain_is_no_improvement(tmp_path):
    # 3% faster, but the start's spread is 4%: inside the noise.
    result, *_ = await go(tmp_path, [["# ms: 9.7\n# spread: 4"]])
    assert not result.improved and result.best is None and result.outcome == "no_improvement"
    assert "no candidate was faster than the start by more than the measured noise (best 1.03x)" in result.reason
    assert result.headline.startswith("no improvement: ")


async def test_confirmation_rerun_can_reject(tmp_path):
    # Looked 2x faster in the search, but its re-timing (2nd evaluation) is as slow as the start.
    result, store, _, events = await go(tmp_path, [["# ms: 5\n# ms@2: 10"]])
    assert not result.improved and not result.confirmed
    assert "not_confirmed" in [e.kind for e in events]
    assert "no candidate stayed faster than the start when re-timed (best 1.00x" in result.reason
    # The ranking shows the re-timed number for the re-timed candidate, and says so.
    row = next(r for r in result.ranking if r["note"].startswith("# ms: 5"))
    assert row["measurement"] == "confirmation" and row["speedup"] == pytest.approx(1.0)
    assert store.search(result.search_id)["budget"]["result"]["improved"] is False


async def test_compile_error_goes_back_for_repair_with_compiler_messages(tmp_path):
    result, _, proposer, _ = await go(tmp_path, [
        ["# verdict: compile_error"],
        ["# ms: 4  fixed"],
    ], children=1)
    repair = proposer.requests[1]
    assert repair.mode == "repair" and repair.evaluation.verdict == "compile_error"
    assert "expected ';'" in repair.evaluation.compile.log
    assert result.improved and result.best.note == "# ms: 4  fixed"


async def test_repair_rounds_are_bounded(tmp_path):
    result, _, proposer, _ = await go(tmp_path, [
        ["# verdict: mismatch  a"], ["# verdict: mismatch  b"], ["# verdict: mismatch  c"],
        ["# verdict: mismatch  d"], ["# verdict: mismatch  e"],
    ], children=1, repair_rounds=2, max_children=1)
    modes = [r.mode for r in proposer.requests]
    assert modes == ["optimize", "repair", "repair"]
    assert not result.improved


async def test_profile_only_for_correct_nodes_deep_enough(tmp_path):
    engine = FakeEngine()
    result, _, proposer, _ = await go(tmp_path, [["# ms: 8"], ["# ms: 6"], ["# ms: 5"]],
                                      engine=engine, children=1, profile_after_depth=1)
    assert proposer.requests[0].profile is None  # the root (depth 0)
    assert any(r.profile and r.profile["hot_ops"] for r in proposer.requests[1:])
    assert all(r.evaluation.verdict == "correct" for r in proposer.requests if r.profile)


async def test_budget_and_patience_stop(tmp_path):
    result, _, proposer, _ = await go(tmp_path, [["# ms: 11 a", "# ms: 12 b"]] * 10,
                                      budget=Budget(proposals=100, patience=2))
    assert "no gain in 2 rounds" in result.reason
    result, _, proposer, _ = await go(tmp_path, [["# ms: 11 a%d" % i, "# ms: 12 b%d" % i] for i in range(9)],
                                      budget=Budget(proposals=3, patience=None))
    assert "proposal budget spent (3/3)" in result.reason


async def test_failed_and_fatal_proposals_are_recorded_steps(tmp_path):
    result, store, _, events = await go(tmp_path, [
        [Proposal.failed("unusable answer: prose only")],
        [Proposal.failed("authentication failed (HTTP 401): check the API key", fatal=True)],
    ], budget=Budget(proposals=10, patience=5))
    # Nothing but the start ever ran: the proposer could not work at all (exit 2 on the CLI).
    assert "authentication failed" in result.reason and result.state == "done"
    assert result.outcome == "cannot_run" and len(result.failed_steps) == 2
    steps = store.search(result.search_id)["budget"]["steps"]
    assert [s["reason"] for s in steps if s["failed"]] == [
        "unusable answer: prose only", "authentication failed (HTTP 401): check the API key"]
    assert [e.kind for e in events].count("proposal_failed") == 2


async def test_prebuild_called_for_every_child(tmp_path):
    engine = FakeEngine()
    await go(tmp_path, [["# ms: 8 a", "# ms: 9 b"]], engine=engine)
    assert len(engine.prebuilt) == 2


async def test_progress_callback_errors_do_not_stop_search(tmp_path):
    store = Store(tmp_path / "s.sqlite")

    def bad(ev):
        raise RuntimeError("display broke")

    search = Search(FakeEngine(), store, TASK, START, Scripted([["# ms: 5"]]), SearchOptions(near_duplicates=False))
    result = await search.run(bad)
    assert result.improved


async def test_cancel_mid_search_leaves_store_consistent(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    proposer = Scripted([["# ms: 5 good"], ["# hang"]])
    search = Search(FakeEngine(), store, TASK, START, proposer, SearchOptions(near_duplicates=False, children=1))
    seen = asyncio.Event()

    def progress(ev):
        if ev.kind == "evaluating" and ev.note == "# hang":
            seen.set()

    task = asyncio.create_task(search.run(progress))
    await asyncio.wait_for(seen.wait(), 5)
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 1.0
    row = store.search(search.search_id)
    assert row["state"] == "cancelled" and row["finished"] is not None
    good = next(n for n in row["nodes"] if n["note"] == "# ms: 5 good")
    assert row["best"] == good["candidate"] and good["evaluation"]["verdict"] == "correct"
    assert row["budget"]["result"]["improved"] is False  # unconfirmed: never applied
    assert search.result.state == "cancelled"
    # Every evaluated candidate has its evaluation in the store.
    assert len(store.evaluations(TASK.name)) == 2


async def test_failing_start_accepts_a_repair(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    broken = Candidate(source="class ModelNew: ...\n# verdict: compile_error\n", kind="python")
    proposer = Scripted([["# ms: 20  fixed but slow"]])
    result = await Search(FakeEngine(), store, TASK, broken, proposer, SearchOptions(near_duplicates=False)).run()
    assert proposer.requests[0].mode == "repair"
    assert result.improved and result.speedup is None and "fixed" in result.best.note


async def test_flagged_start_is_still_the_bar_to_beat(tmp_path):
    # A start the engine flags (e.g. torch_fallback) is correct and timed: a slower candidate
    # must not count as an "improvement" just because the start does not qualify as a kernel.
    store = Store(tmp_path / "s.sqlite")
    start = Candidate(source="class ModelNew: ...\n# ms: 10\n# flags: torch_fallback,not_counted\n", kind="python")
    proposer = Scripted([["# ms: 20  slower kernel"], ["# ms: 4  faster kernel"]])
    result = await Search(FakeEngine(), store, TASK, start, proposer,
                          SearchOptions(near_duplicates=False, children=1, budget=Budget(proposals=2))).run()
    assert proposer.requests[0].mode == "optimize"
    assert result.improved and result.best.note == "# ms: 4  faster kernel"
    assert result.speedup == pytest.approx(2.5)


async def test_baselines_only_for_the_first_start_evaluation(tmp_path):
    engine = FakeEngine()
    await go(tmp_path, [["# ms: 5"]], engine=engine)
    # start (engine defaults), child, then start and child re-timed: without baselines
    assert engine.options == [None, {"baselines": False}, {"baselines": False}, {"baselines": False}]


async def test_repair_only_stops_once_repaired(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    broken = Candidate(source="class ModelNew: ...\n# verdict: compile_error\n", kind="python")
    proposer = Scripted([["# verdict: mismatch  still wrong"], ["# ms: 30  fixed"], ["# ms: 1  never asked"]])
    result = await Search(FakeEngine(), store, TASK, broken, proposer,
                          SearchOptions(near_duplicates=False, repair_only=True, repair_rounds=3)).run()
    assert [r.mode for r in proposer.requests] == ["repair", "repair"]
    assert result.improved and result.best.note == "# ms: 30  fixed" and result.reason == "repaired"
    # A start that already works: nothing to do.
    proposer = Scripted([["# ms: 1"]])
    result = await Search(FakeEngine(), store, TASK, START, proposer, SearchOptions(near_duplicates=False, repair_only=True)).run()
    assert proposer.requests == [] and not result.improved


# -- what the result says (issue: reasons, both baselines, PyTorch rewrites) -------------------

async def test_faster_pytorch_rewrite_wins_labelled_with_both_baselines(tmp_path):
    # The start: 10 ms, eager 10 ms, torch.compile 3 ms. A rewrite at 5 ms is the winner: 2x the
    # start and eager, but torch.compile is faster, and every front end must be able to say so.
    global START
    saved = START
    START = Candidate(source="class ModelNew: ...\n# ms: 10\n# compiled: 3\n", kind="python")
    try:
        result, store, _, _ = await go(tmp_path, [["# ms: 5  vectorized\n# rewrite", "# ms: 12  slower"]],
                                       budget=Budget(proposals=2, patience=3))
    finally:
        START = saved
    assert result.improved and result.outcome == "improved" and result.measurement == "confirmation"
    assert result.custom_kernel is False and result.label == "PyTorch rewrite (no custom kernel)"
    assert result.speedup == pytest.approx(2.0)
    assert result.speedup_eager == pytest.approx(2.0) and result.speedup_compile == pytest.approx(0.6)
    assert result.compile_faster is True and result.noisy is False and result.spread_pct == pytest.approx(0.5)
    doc = result.to_dict()
    for key in ("reason", "failed_steps", "speedup_eager", "speedup_compile", "custom_kernel", "label",
                "measurement", "spread_pct", "noisy", "compile_faster", "outcome", "headline"):
        assert key in doc
    # One number per candidate: the ranking's winner row is the result's own measurement.
    top = doc["ranking"][0]
    assert top["winner"] and top["speedup"] == result.speedup and top["measurement"] == "confirmation"
    assert top["label"] == "PyTorch rewrite (no custom kernel)"
    assert "torch.compile of the reference is faster" in result.headline
    assert "PyTorch rewrite (no custom kernel)" in result.headline
    # The store keeps this Search's own numbers for its report.
    stored = store.search(result.search_id)["budget"]["result"]
    assert stored["speedup_compile"] == pytest.approx(0.6) and stored["label"] == result.label


async def test_kernels_only_keeps_the_strict_rule(tmp_path):
    result, *_ = await go(tmp_path, [["# ms: 5  vectorized\n# flags: torch_fallback", "# ms: 4\n# rewrite"]],
                          budget=Budget(proposals=2, patience=3), kernels_only=True)
    assert not result.improved and result.outcome == "no_improvement"
    assert "PyTorch rewrites, which kernels_only does not count" in result.reason
    # Without kernels_only the same two candidates win, as rewrites.
    result, *_ = await go(tmp_path / "b", [["# ms: 5  vectorized\n# flags: torch_fallback", "# ms: 4\n# rewrite"]],
                          budget=Budget(proposals=2, patience=3))
    assert result.improved and result.label == "PyTorch rewrite (no custom kernel)"


async def test_no_gpu_stops_at_once_with_the_reason(tmp_path):
    global START
    saved = START
    START = Candidate(source="__global__ void k() {}\n# verdict: not_run\n", kind="cuda")
    try:
        result, _, proposer, _ = await go(tmp_path, [["# ms: 1"]])
    finally:
        START = saved
    assert result.outcome == "cannot_run" and not result.improved
    assert result.reason == "built; a .cu candidate needs a GPU to run; none is visible"
    assert proposer.requests == []  # nothing was proposed: it could not have run
    assert result.headline.startswith("could not run: ")
    assert result.candidates_evaluated == 1


async def test_proposer_precheck_and_check_stop_before_timing(tmp_path):
    from kernel_lsp.verdicts import EndpointUnreachable

    class Nothing(Scripted):
        def precheck(self, start, device):
            return "the tuner found nothing to vary in this source; rewriting it needs an LLM"

    class Down(Scripted):
        async def check(self):
            raise EndpointUnreachable("endpoint unreachable: cannot reach http://127.0.0.1:9/v1")

    for cls, words in ((Nothing, "nothing to vary"), (Down, "endpoint unreachable")):
        engine = FakeEngine()
        store = Store(tmp_path / f"{cls.__name__}.sqlite")
        result = await Search(engine, store, TASK, START, cls([["# ms: 1"]]), SearchOptions(near_duplicates=False)).run()
        assert result.outcome == "cannot_run" and words in result.reason
        assert engine.calls == []  # not even the start was timed
        assert result.failed_steps and words in result.failed_steps[0]["reason"]


async def test_noisy_winner_is_flagged(tmp_path):
    result, *_ = await go(tmp_path, [["# ms: 2\n# spread: 30"]], confirm=False,
                          budget=Budget(proposals=1, patience=3))
    assert result.improved and result.measurement == "first run"
    assert result.noisy and result.spread_pct == pytest.approx(30.0)
    assert "noisy, not a reliable number" in result.headline


async def test_compile_only_repair_needs_no_run(tmp_path):
    # Fixing a compile error: the compiler is the test; a .cu without a GPU can still be repaired.
    global START
    saved = START
    START = Candidate(source="__global__ void k() {}\n# verdict: compile_error\n", kind="cuda")
    try:
        result, _, proposer, _ = await go(tmp_path, [["# fixed"]], repair_only=True, checks=("compile",))
    finally:
        START = saved
    assert result.improved and result.outcome == "improved" and result.reason == "repaired"
    assert result.best.note == "# fixed" and result.speedup is None
    assert proposer.requests[0].mode == "repair"


async def test_no_gpu_known_from_the_device_stops_before_building(tmp_path):
    class CpuEngine(FakeEngine):
        async def device_info(self):
            return {"cuda": False, "name": "cpu", "note": "no CUDA GPU visible: CPU only"}

    engine = CpuEngine()
    start = Candidate(source="__global__ void k() {}\n#define BLOCK 128\n", kind="cuda")
    result = await Search(engine, Store(tmp_path / "s.sqlite"), TASK, start, Scripted([["# ms: 1"]]),
                          SearchOptions(near_duplicates=False)).run()
    assert result.outcome == "cannot_run" and result.reason == "a .cu candidate needs a GPU to run; none is visible"
    assert engine.calls == [] and result.failed_steps[0]["kind"] == "device"
