"""Store: schema and migrations, round trips, Search trees, WAL concurrency across threads and processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading

import pytest

from kernel_lsp.model import (
    Candidate, CompileResult, Diagnostic, Evaluation, ResourceUsage, Span, Task, Timing,
)
from kernel_lsp.store import SCHEMA_VERSION, SchemaTooNew, Store, StoreError, store_path

TASK = Task(name="softmax", reference_path="/w/softmax.py", reference_source="class Model: ...\n",
            cuda_path="/w/softmax.cu", entry="softmax_forward", atol=1e-3)


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, min_ms=ms * 0.9, max_ms=ms * 1.1, spread_pct=2.0, runs=50)


def full_evaluation(cand: Candidate, ms: float = 1.0, correct: bool = True) -> Evaluation:
    return Evaluation(
        task="softmax", candidate=cand.id, verdict="correct" if correct else "mismatch", correct=correct,
        message="ok", flags=["beyond_roofline"], evidence={"max_abs_err": 1e-6, "input_set": 2},
        compile=CompileResult(ok=True, diagnostics=[Diagnostic(Span(1, 2, 1, 5), "warning", "unused")],
                              resources=[ResourceUsage(kernel="k", mangled="_Z1kv", arch="sm_90", registers=32)],
                              log="ptxas info", seconds=1.7, cached=False, command=["nvcc"]),
        time=timing(ms), eager=timing(2.0), compiled=timing(1.5), profile={"dram_gbps": 3000.0},
        device={"name": "NVIDIA H200", "sm_count": 132}, versions={"torch": "2.11"}, wall_seconds=4.2,
    )


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    yield s
    s.close()


def test_workspace_layout_wal_and_schema(tmp_path, store):
    assert store.path == store_path(tmp_path) == tmp_path / ".kernel-lsp" / "store.sqlite"
    assert store.path.exists() and store.schema_version() == SCHEMA_VERSION
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"schema_version", "tasks", "candidates", "evaluations", "searches", "search_nodes"} <= tables
    conn.close()
    again = Store(store.path)  # reopening migrates nothing and keeps data
    assert again.schema_version() == SCHEMA_VERSION
    again.close()


def test_newer_schema_is_a_clear_error(tmp_path, store):
    store.close()
    conn = sqlite3.connect(store_path(tmp_path))
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNew, match="upgrade kernel-lsp"):
        Store(tmp_path)


def test_evaluation_round_trip_and_queries(store):
    assert store.add_task(TASK) == "softmax" and store.task("softmax") == TASK
    parent = Candidate(source="__global__ void k(){}\n", kind="cuda")
    child = Candidate(source="__global__ void k2(){}\n", kind="cuda", origin="llm", parent=parent.id, note="tiles")
    assert store.add_candidate("softmax", parent) == parent.id
    store.add_candidate("softmax", parent)  # idempotent
    store.add_candidate("softmax", child)
    ev1 = full_evaluation(parent, ms=1.0)
    ev2 = full_evaluation(child, ms=0.5)
    bad = full_evaluation(child, ms=0.1, correct=False)
    ids = [store.add_evaluation("softmax", e) for e in (ev1, ev2, bad)]
    assert ids == sorted(ids)
    assert store.evaluations("softmax") == [bad, ev2, ev1]  # newest first, every field back
    assert store.evaluations("softmax", candidate=parent.id) == [ev1]
    assert store.evaluations("softmax", limit=1) == [bad]
    assert store.latest("softmax") == bad and store.latest("nope") is None
    best = store.best("softmax")
    assert best is not None and best[0] == child and best[1] == ev2  # correct beats faster-but-wrong
    assert store.candidate(child.id) == child
    assert {c.id for c in store.candidates("softmax")} == {parent.id, child.id}
    row = sqlite3.connect(store.path).execute(
        "SELECT verdict, correct, time_ms, speedup_eager, speedup_compile, device FROM evaluations WHERE id = ?",
        (ids[1],)).fetchone()
    assert row == ("correct", 1, 0.5, 4.0, 3.0, "NVIDIA H200")


def test_evaluation_for_unknown_candidate_is_kept(store):
    ev = Evaluation(task="other", candidate="deadbeefdeadbeef", verdict="crashed", message="SIGSEGV")
    store.add_evaluation("other", ev)
    assert store.evaluations("other") == [ev]
    late = Candidate(source="late text", kind="python")
    store.add_evaluation("other", Evaluation(task="other", candidate=late.id, verdict="correct"))
    store.add_candidate("other", late)  # the placeholder row gets the real source
    assert store.candidate(late.id) == late


def test_search_tree(store):
    root = Candidate(source="v0", kind="python")
    a = Candidate(source="v1", kind="python", origin="llm", parent=root.id)
    b = Candidate(source="v2", kind="python", origin="llm", parent=a.id)
    sid = store.start_search("softmax", root, "llm", {"candidates": 8})
    store.add_node(sid, a, root.id, depth=1, step=1)
    store.add_node(sid, b, a.id, depth=2, step=2, status="evaluated")
    store.add_evaluation("softmax", full_evaluation(b, ms=0.4))
    store.update_node(sid, a.id, "evaluated")
    assert store.searches("softmax")[0]["state"] == "running"
    store.update_search(sid, best=b.id, budget={"candidates": 8, "used": 2})
    store.finish_search(sid, "done", best=b.id)
    s = store.search(sid)
    assert s["state"] == "done" and s["best"] == b.id and s["finished"] >= s["started"]
    assert s["budget"] == {"candidates": 8, "used": 2} and s["proposer"] == "llm"
    tree = s["tree"]
    assert tree["candidate"] == root.id and tree["status"] == "root"
    assert tree["children"][0]["candidate"] == a.id and tree["children"][0]["status"] == "evaluated"
    leaf = tree["children"][0]["children"][0]
    assert leaf["candidate"] == b.id and leaf["depth"] == 2 and leaf["evaluation"]["time"]["median_ms"] == 0.4
    assert store.search(9999) is None
    assert [x["id"] for x in store.searches()] == [sid]
    with pytest.raises(StoreError):
        store.update_search(sid, state="exploded")
    with pytest.raises(StoreError):
        store.add_node(9999, a, None, 0)


def test_failed_write_rolls_back(store):
    cand = Candidate(source="x", kind="python")
    store.add_candidate("softmax", cand)
    sid = store.start_search("softmax", cand, "tuner")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_node(sid, "not-a-candidate-id", None, 1)  # foreign keys are on
    assert [n["candidate"] for n in store.search(sid)["nodes"]] == [cand.id]


def test_threads_read_while_one_writes(store):
    store.add_task(TASK)
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for i in range(150):
                c = Candidate(source=f"v{i}", kind="python")
                store.add_evaluation("softmax", full_evaluation(c, ms=1.0 + i), candidate=c)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    def reader() -> None:
        try:
            last = 0
            while not done.is_set():
                n = len(store.evaluations("softmax"))
                assert n >= last  # never goes back: committed writes stay
                last = n
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(store.evaluations("softmax")) == 150


def _write_many(path: str, tag: str, n: int) -> None:
    s = Store(path)
    for i in range(n):
        c = Candidate(source=f"{tag}-{i}", kind="python")
        s.add_evaluation("softmax", Evaluation(task="softmax", candidate=c.id, verdict="correct"), candidate=c)
    s.close()


def test_processes_write_concurrently_nothing_lost(tmp_path):
    path = str(store_path(tmp_path))
    Store(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, f"p{k}", 60)) for k in range(3)]
    for p in procs:
        p.start()
    reader = Store(path)
    seen = 0
    while any(p.is_alive() for p in procs):
        seen = max(seen, len(reader.evaluations("softmax")))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(reader.evaluations("softmax")) == 180 and len(reader.candidates("softmax")) == 180
    reader.close()


def _open_and_close(path: str) -> None:
    Store(path).close()


def test_many_processes_open_a_new_file_at_once(tmp_path):
    # Switching a new file to WAL does not wait on SQLite's busy handler; before the
    # retry, 9 of 240 openings like these failed with "database is locked".
    ctx = multiprocessing.get_context("fork")
    for round_ in range(30):
        path = str(tmp_path / f"new{round_}.sqlite")
        procs = [ctx.Process(target=_open_and_close, args=(path,)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 6


def test_closed_store_refuses(tmp_path):
    s = Store(tmp_path)
    s.close()
    with pytest.raises(StoreError):
        s.latest("x")


def test_two_stores_migrate_the_same_new_file_at_once(tmp_path):
    path = tmp_path / "fresh.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), f"m{k}", 1)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    s = Store(path)
    assert s.schema_version() == SCHEMA_VERSION and len(s.evaluations("softmax")) == 3
    s.close()
