"""`--timings` shows a build's steps and the Worker's phases indented, outside the total."""

import io
from types import SimpleNamespace

from kernel_lsp.cli.timings import Phases, worker_phases


def test_build_steps_and_worker_phases_are_indented_and_not_counted_twice():
    phases = Phases()
    phases.begin("t.py: compiling")
    phases.begin("t.py: evaluating")
    phases.end()
    before = phases.total()
    ev = SimpleNamespace(evidence={"build_steps": {"device": 1.25, "host": 0.5, "link": 0.25, "worker_s": 2.5,
                                                   "note": "not a number"},
                                   "phases": {"verify_s": 0.5, "torch_compile_s": 1.0}})
    worker_phases(phases, ev)
    rows = dict(phases.rows)
    assert rows["  build: device"] == 1.25 and rows["  build: worker"] == 2.5 and rows["  verify"] == 0.5
    assert "  build: note" not in rows
    assert phases.total() == before  # measured inside a span already counted
    out = io.StringIO()
    phases.print(out)
    text = out.getvalue()
    assert text.index("build: device") < text.index("verify")  # the build came first


def test_an_evaluation_without_evidence_adds_nothing():
    phases = Phases()
    n = len(phases.rows)
    worker_phases(phases, SimpleNamespace(evidence=None))
    assert len(phases.rows) == n
