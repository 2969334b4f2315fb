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
                                                   "pch_wait": 27.5, "note": "not a number"},
                                   "phases": {"verify_s": 0.5, "torch_compile_s": 1.0}})
    worker_phases(phases, ev)
    rows = dict(phases.rows)
    assert rows["  build: device"] == 1.25 and rows["  build: worker"] == 2.5 and rows["  verify"] == 0.5
    assert "  build: note" not in rows
    assert rows["  build: waiting for the precompiled headers another process makes"] == 27.5
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


def test_with_live_each_phase_is_written_as_it_opens():
    """A bench cut short (a time cap, a kill) still says where it was: the phases come one line
    each as they open, before the table."""
    live = io.StringIO()
    phases = Phases(live=live)
    phases.begin("t.py: compiling")
    assert live.getvalue().splitlines()[-1].endswith(" s: t.py: compiling")
    phases.begin("t.py: evaluating")
    phases.end()  # closing opens nothing: no line
    lines = live.getvalue().splitlines()
    assert [line.split(" s: ", 1)[1] for line in lines] == ["t.py: compiling", "t.py: evaluating"]
    assert all(line.startswith("kernel-lsp --timings: ") for line in lines)
