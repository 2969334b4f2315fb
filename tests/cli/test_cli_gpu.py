"""The command line on a real GPU: bench and optimize of an example kernel give both
baselines with their spreads, the kind of result, and exit codes by the rule."""

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.cli import main

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for name in ("softmax.cu", "softmax.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_bench_cu_on_gpu(workspace, capsys):
    assert main(["bench", "softmax.cu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (t,) = doc["targets"]
    assert t["verdict"] == "correct" and t["status"] == 0
    for key in ("time_ms", "eager_ms", "compile_ms", "spread_pct", "eager_spread_pct", "compile_spread_pct",
                "speedup_eager", "speedup_compile"):
        assert isinstance(t[key], float), key
    assert t["custom_kernel"] is True and t["label"] == "custom kernel"
    assert "shared_gpu" in t
    assert main(["bench", "softmax.cu"]) == 0
    out = capsys.readouterr().out
    assert "custom kernel" in out and ("x ±" in out or "~" in out)


def test_optimize_cu_on_gpu(workspace, capsys):
    rc = main(["optimize", "softmax.cu", "--proposer", "tuner", "--budget", "3", "--json", "--out", "best.cu"])
    doc = json.loads(capsys.readouterr().out)
    # The tuner's first variants (BLOCK_SIZE 32 -> 64, 128) are faster on an H200: improved, exit 0.
    assert rc == 0 and doc["status"] == 0 and doc["improved"] is True and doc["reason"], doc
    for key in ("failed_steps", "speedup_eager", "speedup_compile", "custom_kernel", "spread", "measurement"):
        assert key in doc
    assert doc["eager_ms"] and doc["compile_ms"]
    assert doc["custom_kernel"] is True and doc["measurement"] == "confirmation"
    assert doc["speedup_eager"] and doc["speedup_compile"] and doc["spread"] is not None
    assert (workspace / "best.cu").read_text() == doc["best_source"]


def test_bench_timings_say_what_the_build_was_made_of(tmp_path, monkeypatch, capsys):
    """--timings breaks a new load_inline build into its steps (device unit, host units, link, load),
    wherever it ran (the CPU pool, or the Worker before its GPU turn): the "compiling" span of a new
    Task is most of its first number, and this says which step to cut."""
    from kernel_lsp.engine.worker.build.fastbuild import pch_root

    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_root()))  # the machine's headers: no minute-long make
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))  # but a build nothing has cached
    shutil.copy(EXAMPLES / "row_softmax_inline.py", tmp_path / "row_softmax_inline.py")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "row_softmax_inline.py", "--json", "--timings", "--keep-worker", "0"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    phases = {p["phase"]: p["seconds"] for p in doc["timings"]["phases"] if p["inside"]}
    steps = {k.removeprefix("build: "): v for k, v in phases.items() if k.startswith("build: ")}
    assert steps, (phases, err[-2000:])
    assert {"device", "link"} <= set(steps) and ({"pool", "worker"} & set(steps)), steps
    assert "build: device" in err


def test_bench_of_several_files_builds_the_next_while_one_is_evaluated(tmp_path, monkeypatch, capsys):
    """Three new load_inline kernels in one run: while the first is evaluated the CPU pool builds the
    next two (cli/bench.py _BuildAhead), so the third's "compiling" span is the rest of a build
    mostly done, not a build. On an H100 (2026-12-06) these builds take 4-5 s each; the third
    waited 0.0 s at ba98854 and 1.8 s once the evaluations dropped their early timing (shorter
    evaluations cover less of the builds); built in turn it would wait a whole build."""
    from kernel_lsp.engine.worker.build.fastbuild import pch_root

    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_root()))
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))  # builds nothing has cached
    tasks = Path(__file__).resolve().parents[2] / "benchmarks" / "tasks"
    names = ("relu", "elu", "gelu_tanh")
    for name in names:
        for f in (f"{name}.py", f"{name}_new.py"):
            shutil.copy(tasks / f, tmp_path / f)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *(f"{n}_new.py" for n in names), "--json", "--timings", "--keep-worker", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["verdict"] for t in doc["targets"]] == ["correct"] * 3
    spans = {p["phase"]: p["seconds"] for p in doc["timings"]["phases"] if not p["inside"]}
    print("\n" + "\n".join(f"  {k:<50} {v:7.3f}" for k, v in spans.items()))
    second, third = spans.get("elu_new.py: compiling", 0.0), spans.get("gelu_tanh_new.py: compiling", 0.0)
    assert third < 2.5 and third <= second, spans
