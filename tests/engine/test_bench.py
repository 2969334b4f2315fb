"""bench.py, roofline.py and profile.py on the CPU, and run.evaluate's bench stage."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.worker.timing import bench, profile, roofline  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.engine.worker.run import device_info  # noqa: E402
from kernel_lsp.model import Candidate, Task  # noqa: E402

CHEATS = Path(__file__).parent / "cheats"


def test_stats_median_and_iqr() -> None:
    t = bench.stats([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (t.median_ms, t.min_ms, t.max_ms, t.runs) == (3.0, 1.0, 5.0, 5)
    assert t.spread_pct == pytest.approx(100.0 * (4.0 - 2.0) / 3.0)


def test_slow_measured_slower_than_fast() -> None:
    x = [torch.randn(8)]
    slow = bench.time_fn(lambda x: time.sleep(0.003), [x], "cpu", min_runs=20, budget_s=0.3)
    fast = bench.time_fn(lambda x: x + 1, [x], "cpu", min_runs=20, budget_s=0.3)
    assert slow.timing.runs >= 20 and fast.timing.runs >= 20
    assert slow.timing.min_ms >= 3.0
    assert fast.timing.median_ms < slow.timing.median_ms
    assert fast.timing.runs > slow.timing.runs  # adaptive: short calls get more runs


def test_the_medians_interval_narrows_with_samples() -> None:
    assert bench.median_interval_pct([1.0] * 5) == float("inf")  # too few to say
    assert bench.median_interval_pct([1.0] * 50) == 0.0
    spread = [1.0 + 0.01 * ((i * 37) % 21 - 10) / 10 for i in range(400)]   # +-1 % around 1.0
    assert 0.0 < bench.median_interval_pct(spread) < bench.median_interval_pct(spread[:40]) <= 1.0


def test_a_steady_timing_settles_before_its_budget_and_a_noisy_one_does_not() -> None:
    """bench.Settle: a call that takes the same time every run stops once its median is known
    (after the minimum time); one whose time jumps by 2x at random keeps going to its budget."""
    import random

    rng = random.Random(7)
    settle = bench.Settle(min_s=0.1, precision_pct=0.5, min_runs=50, every=5)
    t0 = time.perf_counter()
    steady = bench.time_interleaved([lambda: time.sleep(0.0005)], [[]], "cpu", min_runs=20, max_runs=5000,
                                    budget_s=3.0, settle=settle)[0]
    steady_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    noisy = bench.time_interleaved([lambda: time.sleep(0.0005 * rng.choice((1, 2)))], [[]], "cpu", min_runs=20,
                                   max_runs=5000, budget_s=0.6, settle=settle)[0]
    noisy_s = time.perf_counter() - t0
    # Facts, not wall time (a loaded 2-core machine stretches every sleep): the steady call stopped
    # once its median was known, before the runs its budget planned (3 s / 0.5 ms, capped at 5000) ...
    assert 50 <= steady.timing.runs < 5000, (steady_s, steady.timing)
    assert bench.median_interval_pct(steady.samples_ms) <= 0.5
    # ... and the noisy one's median stayed uncertain, so Settle never stopped it: it ran what its
    # budget planned from the warm-up (or to the deadline).
    assert bench.median_interval_pct(noisy.samples_ms) > settle.precision_pct, (noisy_s, noisy.timing)
    assert not bench._settled([noisy.samples_ms], settle, 0), noisy.timing


def test_runs_cycle_through_input_sets() -> None:
    seen: list[int] = []
    sets = [[i] for i in range(3)]
    bench.time_fn(lambda i: seen.append(i), sets, "cpu", warmup=1, min_runs=20, max_runs=20, budget_s=1.0)
    assert seen[1:7] == [0, 1, 2, 0, 1, 2]


def test_patched_timer_after_import_changes_nothing() -> None:
    original = time.perf_counter_ns
    time.perf_counter_ns = lambda: 0  # what a candidate would do after bench was imported
    try:
        res = bench.time_fn(lambda: time.sleep(0.002), [[]], "cpu", warmup=1, min_runs=5, max_runs=5)
    finally:
        time.perf_counter_ns = original
    assert res.timing.min_ms >= 2.0


@pytest.fixture
def one_thread():
    # Two busy cores make intra-op thread barriers stall for whole time slices (30-60 ms):
    # one thread keeps CPU timings about the code, not the scheduler.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_evaluate_times_slow_and_fast_candidates(one_thread: None) -> None:
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    from kernel_lsp.engine.worker.build import build

    times = {}
    for name in ("correct", "slow_correct"):
        ev = run.evaluate(task, Candidate(source=(CHEATS / f"{name}.py").read_text(), kind="python"),
                          ["compile", "verify", "bench"], {"device": "cpu", "baselines": False,
                                                           "bench_seconds": 0.3}, build)
        assert ev.verdict == "correct", ev.message
        assert ev.time is not None and ev.time.runs >= 20
        assert ev.eager is None and ev.compiled is None  # baselines off
        times[name] = ev.time
    assert times["slow_correct"].min_ms >= 5.0
    assert times["correct"].median_ms < times["slow_correct"].median_ms


@pytest.mark.slow  # torch.compile on 2 CPU cores: about a minute
def test_evaluate_with_baselines_on_cpu() -> None:
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    from kernel_lsp.engine.worker.build import build

    ev = run.evaluate(task, Candidate(source=(CHEATS / "correct.py").read_text(), kind="python"),
                      ["compile", "verify", "bench"], {"device": "cpu", "bench_seconds": 0.2}, build)
    assert ev.verdict == "correct", ev.message
    assert ev.eager is not None and ev.eager.median_ms > 0
    # torch.compile builds on a CPU too (a C++ compiler): both baselines timed, none failed.
    assert ev.compiled is not None and ev.compiled.median_ms > 0, ev.flags
    assert "compile_baseline_failed" not in ev.flags
    assert "tampering" not in ev.flags  # the baselines' own imports are not the candidate's


def test_roofline_table_and_check() -> None:
    roof = roofline.for_device("NVIDIA H200", "torch.float32")
    assert roof.bandwidth == 4.8e12 and roof.source == "table"
    gib = 1 << 30
    floor = roof.floor_ms(gib)
    assert floor == pytest.approx(gib / 4.8e12 * 1e3)
    assert roofline.check(floor * 0.1, gib, None, roof) is not None   # impossible
    assert roofline.check(floor * 1.2, gib, None, roof) is None       # plausible
    # The reference's FLOPs are no floor (a correct candidate may do less arithmetic): 1e15 FLOP
    # of bf16 in 0.1 ms is a shortcut, not beyond the roofline.
    bf16 = roofline.for_device("H200", "torch.bfloat16")
    assert roofline.check(0.1, 1000, int(1e15), bf16) is None
    assert roofline.shortcut(0.1, int(1e15), bf16) is not None
    unknown = roofline.for_device("Mystery GPU")
    assert unknown.floor_ms(gib) is None
    assert roofline.for_device("Mystery GPU", measured_bandwidth=1e12).source == "measured"


def test_hot_ops_on_cpu() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
    prof = profile.hot_ops(model, [torch.randn(64, 256)], "cpu", top=5)
    assert prof["tool"] == "torch.profiler" and prof["time"] == "cpu"
    names = [op["name"] for op in prof["ops"]]
    assert any("addmm" in n or "linear" in n for n in names), names
    assert 0 < sum(op["share_pct"] for op in prof["ops"]) <= 100.0 + 1e-6
    assert len(prof["ops"]) <= 5


NCU_CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python","h","relu2(const float*, float*, long)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","91.5"
"0","123","python","h","relu2(const float*, float*, long)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","12.5"
"0","123","python","h","relu2(const float*, float*, long)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","20.1"
"0","123","python","h","relu2(const float*, float*, long)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","80.2"
'''


def test_parse_ncu_csv() -> None:
    kernels = profile.parse_ncu_csv(NCU_CSV)
    assert len(kernels) == 1
    k = kernels[0]
    assert k["kernel"].startswith("relu2") and k["duration_ms"] == pytest.approx(0.0125)
    assert k["dram_pct"] == 91.5 and k["achieved_occupancy_pct"] == 80.2
    assert k["limiter"] == "memory"
    assert profile.limiting_unit(10, 20) == "latency" and profile.limiting_unit(30, 85) == "compute"


def test_ncu_missing_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    out = profile.ncu_profile(Task(name="t", reference_path="x.py", reference_source=""), None, {})
    assert "not on PATH" in out["note"]


def test_profile_request_on_cpu() -> None:
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    from kernel_lsp.engine.worker.build import build

    out = run.profile(task, Candidate(source=(CHEATS / "correct.py").read_text(), kind="python"),
                      {"device": "cpu"}, build)
    assert out["reference"]["ops"] and out["candidate"]["ops"]
    assert any("addmm" in op["name"] for op in out["reference"]["ops"])


def test_device_info_on_this_machine() -> None:
    info = device_info()
    assert info["torch"] == torch.__version__
    assert info["cuda"] == torch.cuda.is_available()
    if not info["cuda"]:
        assert "CPU" in info["note"]


def test_cli_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # End to end through the real Worker process: a KernelBench pair foo.py + foo_new.py.
    import json

    from kernel_lsp.cli import bench as bench_cli

    (tmp_path / "lin.py").write_text((CHEATS / "ref_linear.py").read_text())
    (tmp_path / "lin_new.py").write_text((CHEATS / "mismatch.py").read_text())
    ns = argparse.Namespace(paths=[str(tmp_path / "lin_new.py")], json=True, timeout=240.0,
                            compile_mode="default")
    rc = bench_cli.bench_main(ns)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1  # the candidate is wrong
    (target,) = doc["targets"]
    assert target["target"] == "lin" and target["verdict"] == "mismatch"
    assert target["evidence"]["where"] == [3, 7]
    from kernel_lsp.engine.caller import sandbox

    assert target["sandboxed"] is sandbox.status().available  # auto: in bubblewrap wherever it runs


# -- side-stream work from this process's own kernels; shared GPUs ----------------------------

def _act(name: str, stream: int, start_us: float, end_us: float) -> "bench.Activity":
    return bench.Activity(name=name, stream=stream, start_ns=int(start_us * 1000), end_ns=int(end_us * 1000))


def test_frame_calls_finds_work_on_other_streams_only() -> None:
    M = "at::cuda::(anonymous namespace)::spin_kernel(long)"
    records = [
        # call 0: one kernel on the timed stream 7
        _act(M, 7, 0, 1), _act("relu2_kernel", 7, 2, 12), _act(M, 7, 20, 21),
        # call 1: the kernel on the timed stream, a spin left running on stream 13
        _act(M, 7, 30, 31), _act("relu2_kernel", 7, 32, 42), _act("spin", 13, 33, 1033), _act(M, 7, 1040, 1041),
    ]
    calls = bench.frame_calls(list(reversed(records)))  # order of records does not matter
    assert len(calls) == 2
    assert calls[0].side == [] and calls[0].span_ms == pytest.approx(0.010)
    assert [a.name for a in calls[1].side] == ["spin"]
    assert calls[1].span_ms == pytest.approx(1.001)  # first start to last end, every stream
    assert bench.frame_calls([_act("k", 7, 0, 1)]) == []  # no markers: nothing can be framed


def test_parse_smi_apps_keeps_this_gpu() -> None:
    from kernel_lsp.engine.worker.timing import gpu_share

    text = ("GPU-aaaa-1111, 4242, python3, 512\n"
            "GPU-bbbb-2222, 77, other, 100\n"
            "GPU-aaaa-1111, 5151, /usr/bin/python, [N/A]\n")
    rows = gpu_share.parse_smi_apps(text, "AAAA-1111")
    assert [r["pid"] for r in rows] == [4242, 5151]
    assert rows[0]["memory_mib"] == 512.0 and rows[1]["memory_mib"] is None


def test_shared_report_counts_other_processes_never_ourselves() -> None:
    from kernel_lsp.engine.worker.timing import gpu_share

    me = {"pid": 10, "name": "python", "memory_mib": 500.0}
    them = {"pid": 11, "name": "train.py", "memory_mib": 9000.0}
    assert gpu_share.shared_report([[me], [me]], 10, "nvml") is None           # alone
    rep = gpu_share.shared_report([[me], [me, them]], 10, "nvml")               # joined mid-way
    assert rep["count"] == 1 and rep["processes"] == [them] and "note" not in rep
    # Container: host PIDs, ours never listed: one listed process is us.
    assert gpu_share.shared_report([[{"pid": 999, "name": "", "memory_mib": None}]], 10, "nvidia-smi") is None
    rep = gpu_share.shared_report([[{"pid": 998, "name": "", "memory_mib": None}, them]], 10, "nvidia-smi")
    assert rep["count"] == 1 and "namespace" in rep["note"]
    assert gpu_share.shared_report([], 10, "") is None  # nothing could be asked: not claimed


def test_watch_through_a_real_nvidia_smi_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: a stand-in nvidia-smi on PATH answers like the real one, through subprocess.
    from kernel_lsp.engine.worker.timing import gpu_share

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU-cafe-0001, 31337, stress, 2048'\necho 'GPU-cafe-0001, %d, python, 600'\n"
                   % os.getpid())
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # NVML not importable
    watch = gpu_share.Watch(None, uuid="cafe-0001")
    rep = watch.finish()
    assert rep is not None and rep["source"] == "nvidia-smi" and rep["count"] == 1
    assert rep["processes"][0]["pid"] == 31337 and len(watch.samples) == 2


def test_cpu_evaluation_is_never_called_shared(one_thread: None) -> None:
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    from kernel_lsp.engine.worker.build import build

    ev = run.evaluate(task, Candidate(source=(CHEATS / "correct.py").read_text(), kind="python"),
                      ["compile", "verify", "bench"], {"device": "cpu", "baselines": False,
                                                       "bench_seconds": 0.2}, build)
    assert ev.verdict == "correct" and ev.shared_gpu is None and "side_stream_work" not in ev.flags


def test_our_own_child_processes_do_not_make_a_gpu_shared() -> None:
    import subprocess
    import sys

    from kernel_lsp.engine.worker.timing import gpu_share

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = {"pid": os.getpid(), "name": "python", "memory_mib": 500.0}
        kid = {"pid": child.pid, "name": "python", "memory_mib": 300.0}
        assert os.getpid() in gpu_share._ancestors(child.pid)
        assert gpu_share.shared_report([[me, kid]], os.getpid(), "nvml") is None
        stranger = {"pid": 1, "name": "init", "memory_mib": 1.0}
        assert gpu_share.shared_report([[me, kid, stranger]], os.getpid(), "nvml")["count"] == 1
    finally:
        child.kill()
        child.wait()


def test_engine_options_are_typed_and_a_bad_one_is_one_clear_error() -> None:
    from kernel_lsp.engine.worker.options import EngineOptions, OptionsError

    o = EngineOptions.from_dict({"runs": "7", "baselines": "false", "atol": 1, "arch": "sm_90", "extra": 1})
    assert (o.runs, o.baselines, o.atol, o.arch, o.seed) == (7, False, 1.0, "sm_90", 42)
    assert o.raw["extra"] == 1  # the dict as sent still reaches the builder
    with pytest.raises(OptionsError, match="'runs'"):
        EngineOptions.from_dict({"runs": "many"})
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    ev = run.evaluate(task, Candidate(source="class ModelNew: pass\n", kind="python"), ["compile", "verify"],
                      {"device": "cpu", "input_sets": "three"}, None)
    assert ev.verdict == "error" and "engine option 'input_sets' cannot be 'three'" in ev.message


def test_profiler_records_are_read_through_this_torchs_api() -> None:
    # The GPU path reads CUDA records the same way; here the CPU ones prove the calls exist.
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.randn(64, 64).sum()
    acts = bench.activities(prof, torch.autograd.DeviceType.CPU)
    assert any("randn" in a.name for a in acts)
    assert all(a.end_ns >= a.start_ns > 0 and isinstance(a.stream, int) for a in acts)


def test_noisy_timing_is_a_warning_flag_not_a_disqualification(one_thread: None) -> None:
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    from kernel_lsp.engine.worker.build import build

    src = (CHEATS / "correct.py").read_text().replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        time.sleep(0.001 if self.calls % 2 else 0.006)\n")
    src = "import time\n" + src
    ev = run.evaluate(task, Candidate(source=src, kind="python"), ["compile", "verify", "bench"],
                      {"device": "cpu", "baselines": False, "bench_seconds": 0.2, "cache_probe": False}, build)
    assert ev.verdict == "correct", ev.message
    assert ev.time.spread_pct > 10 and ev.noisy
    assert "noisy" in ev.flags and "not_counted" not in ev.flags
    assert any("not a reliable number" in n for n in ev.evidence["notes"])


def test_in_the_worker_the_memory_goes_back_after_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.evaluate hands the GPU memory back at once when called in-process; in the Worker's
    loop (answer_first) only once the answer is written (after_answer): gc.collect costs ~0.3 s."""
    from kernel_lsp.engine.worker.build import build

    released: list[int] = []
    monkeypatch.setattr(run, "_release_gpu_memory", lambda: released.append(1))
    monkeypatch.setattr(run, "_answer_first", [])
    monkeypatch.setattr(run, "_release_pending", [])
    ref = (CHEATS / "ref_linear.py").read_text()
    task = Task(name="lin", reference_path=str(CHEATS / "ref_linear.py"), reference_source=ref)
    cand = Candidate(source=(CHEATS / "correct.py").read_text(), kind="python")
    opts = {"device": "cpu", "baselines": False, "bench_seconds": 0.1}
    run.evaluate(task, cand, ["compile", "verify"], opts, build)
    assert released == [1]
    run.answer_first()
    run.evaluate(task, cand, ["compile", "verify"], opts, build)
    assert released == [1] and run._release_pending == [True]
    run.after_answer()
    run.after_answer()   # once per evaluation
    assert released == [1, 1] and run._release_pending == []
