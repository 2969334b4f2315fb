"""Every cheat of docs/cheats.md that can run on a CPU, caught by run.evaluate (no Worker process).

The candidates live in tests/engine/cheats/; the Task is cheats/ref_linear.py (float32 on CPU).
"""

from __future__ import annotations

import contextlib
import time
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.engine.worker.judge import verify  # noqa: E402
from kernel_lsp.model import Candidate, CompileResult, Evaluation, Task  # noqa: E402
from tests.needs import needs_nvcc  # noqa: E402

CHEATS = Path(__file__).parent / "cheats"


class ExecBuilder:
    """The smallest builder: exec the source into a fresh module (no extension builds)."""

    def load_python(self, source: str, filename: str) -> tuple[types.ModuleType | None, CompileResult]:
        module = types.ModuleType(f"cand_{abs(hash((source, filename)))}")
        module.__file__ = filename
        try:
            exec(compile(source, filename, "exec"), module.__dict__)
        except Exception as exc:
            return None, CompileResult(ok=False, log=f"{type(exc).__name__}: {exc}")
        return module, CompileResult(ok=True)

    def load_cuda(self, source: str, filename: str, options: Any) -> tuple[None, CompileResult]:
        return None, CompileResult(ok=False, log="no CUDA builds in this builder")


def _builder() -> Any:
    try:  # the real build cache when it is there: it is what the Worker passes
        from kernel_lsp.engine.worker.build import build

        return build
    except ImportError:
        return ExecBuilder()


def task(ref: str = "ref_linear.py", **kw: Any) -> Task:
    path = CHEATS / ref
    return Task(name=path.stem, reference_path=str(path), reference_source=path.read_text(), **kw)


def evaluate(name: str, checks: tuple[str, ...] = ("compile", "verify"), ref: str = "ref_linear.py",
             builder: Any = None, task_kw: dict[str, Any] | None = None, **options: Any) -> Evaluation:
    source = (CHEATS / f"{name}.py").read_text()
    options.setdefault("baselines", False)
    options.setdefault("device", "cpu")
    return run.evaluate(task(ref, **(task_kw or {})), Candidate(source=source, kind="python"), list(checks),
                        options, builder or _builder())


def test_correct_candidate_passes_clean() -> None:
    ev = evaluate("correct")
    assert ev.verdict == "correct" and ev.correct is True, ev.message
    assert ev.flags == []
    assert "input sets" in ev.message
    assert ev.versions["torch"] == torch.__version__
    assert ev.wall_seconds > 0


@pytest.mark.parametrize("name,verdict", [
    ("mismatch", "mismatch"),
    ("nan_output", "nan"),
    ("unwritten", "unwritten_output"),
    ("empty_output", "unwritten_output"),
    ("mutate_input", "mutated_input"),
    ("cache_ptr", "stale_result"),
    ("cache_id", "stale_result"),
    ("subclass_output", "bad_output"),
    ("wrong_shape", "bad_output"),
    ("wrong_dtype", "bad_output"),
    ("raises", "error"),
])
def test_cheat_gets_its_verdict(name: str, verdict: str) -> None:
    ev = evaluate(name)
    assert ev.verdict == verdict, (ev.verdict, ev.message)
    assert ev.correct is False
    assert ev.message


def test_mismatch_evidence_points_at_the_element() -> None:
    ev = evaluate("mismatch")
    assert ev.evidence is not None
    assert ev.evidence["where"] == [3, 7]
    assert ev.evidence["output"] == "output"
    assert ev.evidence["input_set"] == 0
    assert ev.evidence["max_abs_err"] == pytest.approx(0.5, abs=1e-3)
    assert ev.evidence["mismatched"] == 1 and ev.evidence["numel"] == 32 * 64
    # Judged against the float64 oracle: the evidence carries the ratio to PyTorch's own error.
    assert ev.evidence["rule"] == "oracle" and ev.evidence["ratio"] > 1e4
    assert ev.evidence["oracle"] == pytest.approx(ev.evidence["expected"], rel=1e-5)
    # With the oracle off, the fixed tolerance decides, and says which.
    ev = evaluate("mismatch", oracle=False)
    assert ev.verdict == "mismatch" and ev.evidence["where"] == [3, 7]
    assert ev.evidence["atol"] == 1e-4 and ev.evidence["rtol"] == 1e-4  # KernelBench fp32


def test_unwritten_rows_are_located() -> None:
    ev = evaluate("unwritten")
    assert ev.evidence["where"][0] >= 16  # rows 0..15 were written
    assert ev.evidence["mismatched"] == 16 * 64


class _MemoryHolds(TorchDispatchMode):
    """What the allocator hands out when nobody fills it: every fresh tensor holds `value` (NaN,
    the right answer, zeros), as memory left behind by earlier tests or the reference would."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if str(func.overloadpacket) in ("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty") \
                and out.is_floating_point():
            v = self.value
            out.copy_(v.expand_as(out) if isinstance(v, torch.Tensor) and v.numel() == out.numel()
                      else torch.full_like(out, v if not isinstance(v, torch.Tensor) else 0.0))
        return out


def _right_values() -> torch.Tensor:
    torch.manual_seed(0)
    ref = task().reference_source
    ns: dict[str, Any] = {}
    exec(compile(ref, "ref_linear.py", "exec"), ns)
    model = ns["Model"](*ns["get_init_inputs"]())
    with torch.no_grad():
        return model(*ns["get_inputs"]())


@pytest.mark.parametrize("memory", ["nan", "right_values", "zeros"])
@pytest.mark.parametrize("name,rows", [("empty_output", 32), ("unwritten", 16)])  # rows: written ones
def test_an_unwritten_output_is_unwritten_whatever_memory_held(monkeypatch: pytest.MonkeyPatch, memory: str,
                                                                name: str, rows: int) -> None:
    """Issue 24: `make test` once read `nan` for empty_output, because the repeat run took what the
    allocator handed back (NaN left there by an earlier test). Here every fresh tensor the engine
    does not fill itself holds NaN, the right answer or zeros: the verdict must not move."""
    value = {"nan": float("nan"), "right_values": _right_values(), "zeros": 0.0}[memory]
    real_nan_fill = verify.nan_fill

    @contextlib.contextmanager
    def memory_holds(enabled: bool = True):  # type: ignore[no-untyped-def]
        if enabled:  # the engine's own NaN fill: torch fills, memory does not matter
            with real_nan_fill(True):
                yield
        else:
            with _MemoryHolds(value):
                yield

    monkeypatch.setattr(verify, "nan_fill", memory_holds)
    ev = evaluate(name)
    assert ev.verdict == "unwritten_output", (memory, ev.verdict, ev.message)
    assert ev.evidence["mismatched"] == (32 - rows) * 64 or rows == 32  # empty_output: the first run sees all NaN
    # And with real memory: the allocator's free blocks filled with each value, then freed.
    monkeypatch.setattr(verify, "nan_fill", real_nan_fill)
    for _ in range(3):
        held = [torch.empty(32, 64).copy_(value if isinstance(value, torch.Tensor) else torch.full((32, 64), value))
                for _ in range(8)]
        del held
        ev = evaluate(name)
        assert ev.verdict == "unwritten_output", (memory, ev.verdict, ev.message)


def test_a_nan_the_candidate_writes_itself_stays_nan_whatever_memory_held(monkeypatch: pytest.MonkeyPatch) -> None:
    real_nan_fill = verify.nan_fill

    @contextlib.contextmanager
    def memory_holds(enabled: bool = True):  # type: ignore[no-untyped-def]
        with (real_nan_fill(True) if enabled else _MemoryHolds(0.0)):
            yield

    monkeypatch.setattr(verify, "nan_fill", memory_holds)
    ev = evaluate("nan_output")
    assert ev.verdict == "nan", ev.message


def test_mutated_input_names_the_input() -> None:
    ev = evaluate("mutate_input")
    assert ev.evidence["input"] == 0 and ev.evidence["changed_elements"] > 0


def test_subclass_rejected_before_comparison() -> None:
    ev = evaluate("subclass_output")
    assert ev.evidence["type"] == "Lazy"


def test_task_tolerance_overrides_default() -> None:
    # 0.5 off at one element passes only because the Task says ATOL = 1.
    ev = evaluate("mismatch", task_kw={"atol": 1.0, "rtol": 0.0})
    assert ev.verdict == "correct", ev.message


def test_torch_fallback_is_a_labelled_pytorch_rewrite() -> None:
    # A correct candidate doing the reference's work with PyTorch ops is a PyTorch rewrite:
    # flagged, labelled, never a custom kernel, but not disqualified (kernels_only does that).
    ev = evaluate("fallback")
    assert ev.verdict == "correct"
    assert "torch_fallback" in ev.flags and "not_counted" not in ev.flags
    assert {"aten.addmm", "aten.relu", "aten.mul"} <= set(ev.evidence["fallback_ops"])
    assert ev.custom_kernel is False and ev.label == "PyTorch rewrite (no custom kernel)"
    assert "PyTorch rewrite (no custom kernel)" in ev.message
    assert ev.summary()["custom_kernel"] is False


def test_plain_pytorch_candidate_is_a_rewrite_even_without_the_reference_ops() -> None:
    ev = evaluate("correct")  # einsum + clamp: none of the reference's ops, still no kernel
    assert ev.verdict == "correct" and "torch_fallback" not in ev.flags
    assert ev.custom_kernel is False and ev.label == "PyTorch rewrite (no custom kernel)"


def test_has_kernel_tells_kernels_from_pytorch() -> None:
    from kernel_lsp.engine.worker.judge import static_checks

    assert static_checks.has_kernel('from torch.utils.cpp_extension import load_inline\n'
                                    'src = """__global__ void k(float* x) { x[0] = 1; }"""\n')
    assert static_checks.has_kernel("import triton\n@triton.jit\ndef k(x_ptr):\n    pass\n")
    assert not static_checks.has_kernel("import torch\n# load_inline would go here\nx = torch.ops.aten.add\n")
    assert not static_checks.has_kernel("s = 'load_inline'\n")
    # An import alone is no kernel (a KernelBench file's reference once its ModelNew is cut away,
    # which the no-LLM writer must take for a plain module); a name it imports counts when called.
    assert not static_checks.has_kernel("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
                                        "class Model(torch.nn.Module):\n    def forward(self, x):\n"
                                        "        return torch.relu(x)\n")
    assert not static_checks.has_kernel("import triton\nimport torch\nx = torch.relu\n")
    assert static_checks.has_kernel("from torch.utils.cpp_extension import load_inline as L\nm = L(name='m', "
                                    "cpp_sources='', functions=['f'])\n")
    assert static_checks.has_kernel("from torch.utils.cpp_extension import load\nm = load(name='m', sources=['k.cu'])\n")
    assert static_checks.has_kernel("from torch.utils import cpp_extension\nm = cpp_extension.load_inline(name='m')\n")
    assert static_checks.has_kernel("import ctypes\nlib = ctypes.CDLL('./k.so')\n")
    # The scan's torch_fallback rule reads kernels the same way: an import alone is no kernel beside
    # which torch.matmul would be a fallback.
    plain = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
             "class ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        return torch.matmul(a, b)\n")
    assert "torch_fallback" not in static_checks.flags(static_checks.scan(plain, "python"))
    built = plain.replace("class ModelNew", "ext = load_inline(name='m', cpp_sources='', functions=['f'])\nclass ModelNew")
    assert "torch_fallback" in static_checks.flags(static_checks.scan(built, "python"))


def test_timer_patch_changes_nothing_measured() -> None:
    before = (time.perf_counter_ns, time.perf_counter)
    ev = evaluate("timer_patch", checks=("compile", "verify", "bench"), bench_seconds=0.2, runs=5)
    assert (time.perf_counter_ns, time.perf_counter) == before  # put back
    assert ev.verdict == "correct", ev.message
    assert "timer_patch" in ev.flags and "not_counted" in ev.flags
    assert ev.time is not None and ev.time.min_ms >= 19.0  # it sleeps 20 ms per call
    assert "time.perf_counter_ns" in ev.evidence["tampered"]


def test_patching_the_evaluator_is_an_error() -> None:
    original = verify.compare
    ev = evaluate("tamper_verify")
    assert verify.compare is original  # put back
    assert ev.verdict == "error" and ev.correct is False
    assert "tampering" in ev.flags
    assert "kernel_lsp.engine.worker.judge.verify.compare" in ev.evidence["tampered"]


def test_value_cache_suspected_from_timing() -> None:
    ev = evaluate("value_cache", checks=("compile", "verify", "bench"), bench_seconds=0.3)
    assert ev.verdict == "correct"
    assert "result_cache_suspected" in ev.flags and "not_counted" in ev.flags


def test_correct_candidate_not_suspected_of_caching() -> None:
    ev = evaluate("correct", checks=("compile", "verify", "bench"), bench_seconds=0.3)
    assert ev.verdict == "correct" and "result_cache_suspected" not in ev.flags, ev.evidence


def test_background_thread_is_caught() -> None:
    ev = evaluate("thread_work")
    assert ev.verdict != "correct"
    assert "side_stream" in ev.flags  # static: threading
    assert "thread_started" in ev.flags  # dynamic: a live thread it left behind


def test_weak_reference_flagged() -> None:
    ev = run.evaluate(task("ref_constant.py"), Candidate(source=(CHEATS / "ref_constant.py").read_text().replace(
        "class Model(", "class ModelNew(") , kind="python"), ["verify"], {"device": "cpu"}, _builder())
    assert ev.verdict == "correct"
    assert "near_constant_output" in ev.flags


def test_zero_inputs_flagged() -> None:
    path = CHEATS / "ref_zero_inputs.py"
    ev = run.evaluate(task("ref_zero_inputs.py"), Candidate(source=path.read_text(), kind="python"),
                      ["verify"], {"device": "cpu"}, _builder())
    assert "zero_inputs" in ev.flags


def test_exec_builder_path_works_too() -> None:
    ev = evaluate("mismatch", builder=ExecBuilder())
    assert ev.verdict == "mismatch"


def test_compile_error_is_a_verdict() -> None:
    t = task()
    ev = run.evaluate(t, Candidate(source="class ModelNew(:\n", kind="python"), ["compile", "verify"],
                      {"device": "cpu"}, _builder())
    assert ev.verdict == "compile_error" and ev.compile is not None and not ev.compile.ok


def test_missing_model_new_is_an_error() -> None:
    ev = run.evaluate(task(), Candidate(source="import torch\n", kind="python"), ["verify"],
                      {"device": "cpu"}, _builder())
    assert ev.verdict == "error" and "ModelNew" in ev.message


def test_broken_reference_is_a_harness_error() -> None:
    t = Task(name="broken", reference_path="/tmp/broken.py", reference_source="import torch\n")
    ev = run.evaluate(t, Candidate(source="", kind="python"), ["verify"], {"device": "cpu"}, _builder())
    assert ev.verdict == "error" and ev.message.startswith("harness:")


def test_cuda_task_on_cpu_is_not_run() -> None:
    t = task(cuda_path=str(CHEATS / "x.cu"), entry="f")
    ev = run.evaluate(t, Candidate(source="extern \"C\" void f() {}", kind="cuda"), ["verify"],
                      {"device": "cpu"}, ExecBuilder())
    assert ev.verdict == "compile_error"  # the exec builder cannot build it; the real one would
    assert ev.correct is False


def test_switching_tf32_on_is_precision_lowering() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    ev = evaluate("tf32_switch")
    assert torch.backends.cuda.matmul.allow_tf32 == before  # put back
    assert ev.verdict == "correct"
    assert "precision_lowering" in ev.flags and "not_counted" in ev.flags
    assert any("TF32" in n for n in ev.evidence["notes"])  # seen at run time, not only in the text


@needs_nvcc
def test_cu_candidate_builds_without_a_gpu_but_does_not_run() -> None:
    from kernel_lsp.engine.worker.build import build

    harness = CHEATS / "gpu_relu2.py"
    t = Task(name="gpu_relu2", reference_path=str(harness), reference_source=harness.read_text(),
             cuda_path=str(CHEATS / "gpu_relu2_fast.cu"), entry="relu2")
    ev = run.evaluate(t, Candidate(source=(CHEATS / "gpu_relu2_fast.cu").read_text(), kind="cuda"),
                      ["compile", "verify"], {"device": "cpu", "arch": "sm_90"}, build)
    assert ev.compile is not None and ev.compile.ok, ev.compile and ev.compile.log
    assert ev.verdict == "not_run" and "a .cu candidate needs a GPU to run; none is visible" in ev.message


def test_kernel_beside_a_heavy_pytorch_op_is_a_partial_fallback(tmp_path: Path) -> None:
    # Claims a kernel (a ctypes loader) but an einsum (a matmul) does the reference's work: the
    # label is PyTorch rewrite, never a kernel speedup, though none of the reference's ops ran.
    src = (CHEATS / "correct.py").read_text() + "\nimport ctypes\nKERNEL_LOADER = ctypes.CDLL\n"
    (tmp_path / "partial.py").write_text(src)
    ev = run.evaluate(task(), Candidate(source=src, kind="python"), ["compile", "verify"],
                      {"device": "cpu", "baselines": False}, _builder())
    assert ev.verdict == "correct", ev.message
    assert "torch_fallback" in ev.flags and "not_counted" not in ev.flags
    assert any(op in ("aten.bmm", "aten.mm") for op in ev.evidence["fallback_ops"]), ev.evidence
    assert any("beside its own kernel" in n for n in ev.evidence["notes"])
    assert ev.custom_kernel is False and ev.label == "PyTorch rewrite (no custom kernel)"


def test_threads_torch_starts_for_itself_are_not_the_candidates() -> None:
    # torch.compile's first build leaves a compile pool's threads behind (seen: a cold inductor
    # cache flagged the tuner's torch.compile candidate thread_started). Where a thread was
    # started from decides: torch's own code is excused, the candidate's is not.
    import threading

    original_start = threading.Thread.start
    stop = threading.Event()
    code = "import threading\nt = threading.Thread(target=stop.wait, daemon=True)\nt.start()\n"
    spaces: dict[str, Any] = {}
    with run._thread_origins():
        for name, filename in (("torch", run._TORCH_DIR + "_inductor/fake_pool.py"), ("cand", "cand.py")):
            ns: dict[str, Any] = {"stop": stop}
            exec(compile(code, filename, "exec"), ns)
            spaces[name] = ns["t"]
    try:
        assert run._started_by_torch(spaces["torch"]) and not run._started_by_torch(spaces["cand"])
        # A pool started from torch goes through concurrent.futures: still torch's.
        from concurrent.futures import ThreadPoolExecutor

        with run._thread_origins():
            ns = {"ThreadPoolExecutor": ThreadPoolExecutor, "stop": stop}
            exec(compile("pool = ThreadPoolExecutor(1)\npool.submit(stop.wait)\n",
                         run._TORCH_DIR + "_inductor/fake_async.py", "exec"), ns)
        worker = [t for t in threading.enumerate() if getattr(t, "_kernel_lsp_origin", None)
                  and t not in spaces.values()]
        assert worker and all(run._started_by_torch(t) for t in worker)
    finally:
        stop.set()
    assert threading.Thread.start is original_start  # the recording is undone


@needs_nvcc
def test_compile_only_needs_no_harness(tmp_path: Path) -> None:
    # "Fix this compile error" on a .cu without a harness: the build is the whole check.
    from kernel_lsp.engine.worker.build import build

    cu = tmp_path / "lonely.cu"
    t = Task(name="lonely", reference_path=str(tmp_path / "lonely.py"), reference_source="",
             cuda_path=str(cu))
    broken = 'extern "C" void go(float* x) { x[0] = 1.0f }\n'
    ev = run.evaluate(t, Candidate(source=broken, kind="cuda"), ["compile"], {"arch": "sm_90"}, build)
    assert ev.verdict == "compile_error" and ev.compile is not None and not ev.compile.ok, ev.message
    assert "harness" not in ev.message and ev.message.startswith("does not build")
    fixed = broken.replace("1.0f }", "1.0f; }")
    ev = run.evaluate(t, Candidate(source=fixed, kind="cuda"), ["compile"], {"arch": "sm_90"}, build)
    assert ev.verdict == "not_run" and ev.message == "built" and ev.compile.ok, ev.message
