"""The engine's own extension-build pool (build._threads, for load_inline builds deferred to the
end of a candidate's load) is not a thread the candidate left running: on the H200 every corpus
candidate built in-process read `thread_started` (not counted) because of it. Only an idle pool
is vouched for: work still queued or running there counts, whoever handed it over."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")

from kernel_lsp.engine.worker.build import build  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402


def test_an_idle_build_pool_is_the_engines_and_a_busy_one_is_not():
    pool = build._threads()
    pool.submit(lambda: None).result(timeout=30)
    idle = build.idle_own_threads()
    assert idle and idle == set(pool._threads) and all(t.name.startswith("klsp-ext-build") for t in idle)
    assert run._idle_build_threads(build) == idle

    hold = threading.Event()
    busy = pool.submit(hold.wait, 30)
    try:
        assert build.idle_own_threads() == set()   # work running there: not vouched for
    finally:
        hold.set()
        busy.result(timeout=30)
    for _ in range(100):   # the worker marks itself idle just after the work returns
        if build.idle_own_threads():
            break
        threading.Event().wait(0.01)
    assert build.idle_own_threads() == set(pool._threads)


def test_a_builder_without_a_pool_vouches_for_nothing():
    class NoPool:
        pass
    assert run._idle_build_threads(NoPool()) == set()
