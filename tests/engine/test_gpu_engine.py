"""The engine's judgement on a real GPU: .cu candidates through the real build cache
(`nvcc -shared`, extern "C" launchers), a Triton candidate, poisoning, side streams, ncu.

Run on the device:  python -m pytest tests/engine/test_gpu_engine.py -m gpu -q
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.worker.build import build  # noqa: E402
from kernel_lsp.engine.worker.timing import profile  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.engine.worker.judge import verify  # noqa: E402
from kernel_lsp.model import Candidate, Evaluation, Task  # noqa: E402

pytestmark = pytest.mark.gpu

CHEATS = Path(__file__).parent / "cheats"
HARNESS = CHEATS / "gpu_relu2.py"


def relu2_task(cu: str | None = None) -> Task:
    return Task(name="gpu_relu2", reference_path=str(HARNESS), reference_source=HARNESS.read_text(),
                cuda_path=str(CHEATS / cu) if cu else None, entry="relu2")


def evaluate_cu(cu: str, checks: tuple[str, ...] = ("compile", "verify"), **options: Any) -> Evaluation:
    options.setdefault("baselines", False)
    options.setdefault("bench_seconds", 0.5)
    return run.evaluate(relu2_task(cu), Candidate(source=(CHEATS / cu).read_text(), kind="cuda"),
                        list(checks), options, build)


def test_correct_and_faster_kernel() -> None:
    ev = evaluate_cu("gpu_relu2_fast.cu", ("compile", "verify", "bench"), baselines=True)
    assert ev.verdict == "correct", ev.message
    assert ev.compile is not None and ev.compile.ok
    assert ev.time is not None and ev.eager is not None
    assert ev.compiled is not None or "compile_baseline_failed" in ev.flags
    # Fused: one read + one write of 64 MB against eager's two passes.
    assert ev.time.median_ms < ev.eager.median_ms, (ev.time, ev.eager)
    assert ev.speedup_eager is not None and ev.speedup_eager > 1.2
    assert "not_counted" not in ev.flags and "tampering" not in ev.flags, ev.flags
    assert "beyond_roofline" not in ev.flags, ev.evidence
    assert ev.time.runs >= 20 and ev.time.spread_pct < 50
    assert ev.device and ev.device["cuda"] and ev.device["name"]
    assert ev.versions["cuda"] != "none"


def test_wrong_result_kernel() -> None:
    ev = evaluate_cu("gpu_relu2_wrong.cu")
    assert ev.verdict == "mismatch", ev.message
    assert ev.evidence is not None and ev.evidence["max_abs_err"] > 0.01
    assert len(ev.evidence["where"]) == 1


def test_unwritten_half_caught_by_poisoning() -> None:
    ev = evaluate_cu("gpu_relu2_half.cu")
    assert ev.verdict == "unwritten_output", ev.message
    assert ev.evidence["where"][0] >= (1 << 23)  # the second half


def test_sakana_no_launch_exploit_caught() -> None:
    ev = evaluate_cu("gpu_relu2_nolaunch.cu")
    assert ev.verdict == "unwritten_output", ev.message
    assert ev.correct is False


def test_allocator_poisoning_alone_makes_reused_blocks_nan() -> None:
    # The exploit's mechanism without the deterministic fill: a freed block holding the right
    # answer is handed back by torch.empty; poisoning must have overwritten it first.
    dev = torch.device("cuda")
    answer = torch.full((1 << 22,), 3.0, device=dev)
    nbytes = answer.numel() * 4
    del answer
    verify.poison_free_memory(dev, [nbytes])
    reused = torch.empty(1 << 22, device=dev)
    torch.cuda.synchronize()
    assert torch.isnan(reused).all()


def test_side_stream_work_is_measured() -> None:
    ev = evaluate_cu("gpu_relu2_sidestream.cu", ("compile", "verify", "bench"))
    assert ev.verdict == "correct", ev.message
    assert "side_stream_work" in ev.flags, ev.evidence
    assert "side_stream" in ev.flags and "not_counted" in ev.flags  # static: cudaStreamCreate
    assert ev.time is not None and ev.time.median_ms > 1.0  # the 4M-cycle spin counted
    methods = ev.evidence["timing_methods"]
    assert methods["all_streams_ms"] > 5 * methods["events_ms"]
    # Found from this process's own kernels (CUPTI), named: the spin on the private stream.
    assert any("spin" in k["name"] for k in ev.evidence["side_streams"]), ev.evidence["side_streams"]


def test_too_much_shared_memory_names_the_limit() -> None:
    ev = evaluate_cu("gpu_relu2_bigsmem.cu")
    assert ev.verdict == "unwritten_output", ev.message
    props = torch.cuda.get_device_properties(0)
    assert "262144 dynamic" in ev.message, ev.message
    optin = getattr(props, "shared_memory_per_block_optin", None)
    if optin:
        assert f"per-block opt-in limit of {optin} bytes" in ev.message, ev.message


def test_plain_kernel_has_no_side_stream_work() -> None:
    ev = evaluate_cu("gpu_relu2_fast.cu", ("compile", "verify", "bench"))
    assert ev.verdict == "correct", ev.message
    assert "side_stream_work" not in ev.flags and "timing_methods" not in (ev.evidence or {})
    assert ev.custom_kernel is True and ev.label == "custom kernel"


def test_triton_candidate_without_false_flags() -> None:
    pytest.importorskip("triton")
    src = (CHEATS / "gpu_relu2_triton.py").read_text()
    ev = run.evaluate(relu2_task(), Candidate(source=src, kind="python"), ["compile", "verify", "bench"],
                      {"baselines": False, "bench_seconds": 0.5}, build)
    assert ev.verdict == "correct", ev.message
    assert "tampering" not in ev.flags and "torch_fallback" not in ev.flags, ev.evidence
    assert ev.custom_kernel is True  # a Triton kernel is a custom kernel
    assert ev.time is not None and ev.time.median_ms > 0


def test_python_cheats_on_gpu() -> None:
    # The CPU cheat files run on the GPU too (tensors made on the device by the harness).
    ref = CHEATS / "ref_linear.py"
    task = Task(name="lin", reference_path=str(ref), reference_source=ref.read_text())
    expected = {"correct": "correct", "empty_output": "unwritten_output", "mutate_input": "mutated_input",
                "cache_ptr": "stale_result", "subclass_output": "bad_output"}
    for name, verdict in expected.items():
        src = (CHEATS / f"{name}.py").read_text().replace(
            "torch.empty(x.shape[0], self.linear.out_features)",
            "torch.empty(x.shape[0], self.linear.out_features, device=x.device)")
        ev = run.evaluate(task, Candidate(source=src, kind="python"), ["verify"], {}, build)
        assert ev.verdict == verdict, (name, ev.verdict, ev.message)


@pytest.mark.skipif(profile.find_ncu() is None, reason="no ncu found")
def test_ncu_profile_of_a_kernel() -> None:
    out = run.profile(relu2_task("gpu_relu2_fast.cu"),
                      Candidate(source=(CHEATS / "gpu_relu2_fast.cu").read_text(), kind="cuda"), {}, build)
    kernels = out["candidate"].get("kernels")
    assert kernels, out["candidate"]
    k = next(k for k in kernels if "relu2" in k["kernel"])
    assert k["duration_ms"] > 0 and k["limiter"] in ("memory", "compute", "latency")
    assert 0 <= k["dram_pct"] <= 100
    assert out["reference"]["ops"]


def test_device_info_reads_clocks() -> None:
    info = run.device_info("cuda:0")
    assert info["cuda"] and info["sm_count"] > 0 and info["l2_bytes"] > 0
    if shutil.which("nvidia-smi"):
        assert info["clocks_source"] == "nvidia-smi" and info["sm_clock_mhz"]
