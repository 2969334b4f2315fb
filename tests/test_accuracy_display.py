"""Evaluation.accuracy where a user reads it: `bench --json` (summary), bench's text output, the
hover and the HTML report. The Evaluations come from the real engine on the CPU suite."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernel_lsp.cli import bench  # noqa: E402
from kernel_lsp.server.evaluation import measurement_markdown, numbers  # noqa: E402
from kernel_lsp.server.state import Measurement  # noqa: E402
from tests.engine.test_accuracy import SUITE, evaluate_file  # noqa: E402


@pytest.fixture(scope="module")
def gelu():
    from kernel_lsp.model import Timing

    ev = evaluate_file("gelu_tanh_for_erf")
    ev.time = Timing(median_ms=1.0, min_ms=0.9, max_ms=1.1, spread_pct=1.0, runs=20)  # as if timed
    ev.eager = Timing(median_ms=2.0, min_ms=1.9, max_ms=2.1, spread_pct=1.0, runs=20)
    return ev


def test_bench_json_carries_accuracy(gelu) -> None:
    doc = bench._summary(gelu, {"name": "cpu"}, None)
    acc = doc["accuracy"]
    assert acc["rule"] == "oracle" and acc["outcome"] == "less_accurate" and acc["ratio"] > 100
    assert {"cand_err", "ref_err", "budget", "outputs", "oracle", "modes"} <= set(acc)
    assert doc["status"] == bench.PROBLEM  # not counted by default


def test_bench_text_shows_the_ratio_and_the_speedup_not_counted(gelu, monkeypatch) -> None:
    out = io.StringIO()
    bench._bench_table([gelu], {"name": "cpu"}, ["gelu_tanh_for_erf.py"], [None], out)
    text = out.getvalue()
    assert "accuracy:" in text and "PyTorch's error against float64" in text
    assert "beyond the 100x budget: less accurate" in text
    assert "not counted (accept_less_accurate = true counts it)" in text
    assert "2.00x" in text  # its speedup is shown beside its accuracy
    monkeypatch.setattr(bench, "_accept_less_accurate", lambda: True)
    assert bench.status(gelu) == bench.OK


def test_hover_and_lens_say_how_accurate(gelu) -> None:
    text = (SUITE / "gelu_tanh_for_erf.py").read_text()
    m = Measurement(evaluation=gelu, version=1, text=text)
    lines = "\n".join(measurement_markdown(m, text))
    assert "Accuracy: " in lines and "x PyTorch's error against float64" in lines
    assert "less accurate: " in numbers(m) and "not counted" in numbers(m)


def test_report_shows_accuracy(tmp_path: Path, gelu) -> None:
    from kernel_lsp.agent.report import _evaluation, _View  # noqa: F401

    html_row = _evaluation(gelu.to_dict(), _FakeView(), gelu.candidate, None)
    assert "accuracy" in html_row and "PyTorch&#x27;s error against float64" in html_row


class _FakeView:
    root_id = "root"
    root_first = None

    def speedup(self, cand):
        return None, None
