"""verify.py's parts: tolerances, comparisons with evidence, poisoning, structure checks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.worker.judge import static_checks  # noqa: E402
from kernel_lsp.engine.worker.judge.verify import (  # noqa: E402
    _Fail,
    check_structure,
    compare,
    compare_tensor,
    nan_fill,
    poison_free_memory,
    tolerance_for,
)


def test_default_tolerances_are_kernelbench_s() -> None:
    assert tolerance_for(torch.float32, None, None) == (1e-4, 1e-4)
    assert tolerance_for(torch.float16, None, None) == (1e-2, 1e-2)
    assert tolerance_for(torch.bfloat16, None, None) == (1e-2, 1e-2)
    assert tolerance_for(torch.int64, None, None) == (0.0, 0.0)
    assert tolerance_for(torch.float32, 0.5, None) == (0.5, 1e-4)


def test_fp32_within_and_beyond_tolerance() -> None:
    ref = torch.ones(10)
    assert compare_tensor(ref + 1.5e-4, ref, None, None) is None  # 1e-4 + 1e-4 * 1
    ev = compare_tensor(ref + 3e-4, ref, None, None)
    assert ev is not None and ev["mismatched"] == 10


def test_fp16_uses_looser_tolerance() -> None:
    ref = torch.ones(10, dtype=torch.float16)
    assert compare_tensor(ref + 0.01, ref, None, None) is None
    assert compare_tensor(ref + 0.05, ref, None, None) is not None


def test_evidence_unravels_worst_index() -> None:
    ref = torch.zeros(2, 3, 4)
    out = ref.clone()
    out[1, 2, 3] = 5.0
    out[0, 0, 1] = 1.0
    ev = compare(out, ref, None, None, input_set=2)
    assert ev is not None
    assert ev["where"] == [1, 2, 3] and ev["got"] == 5.0 and ev["expected"] == 0.0
    assert ev["max_abs_err"] == 5.0 and ev["mismatched"] == 2 and ev["input_set"] == 2


def test_nan_never_passes_and_matching_nan_does() -> None:
    ref = torch.randn(8)
    out = ref.clone()
    out[4] = float("nan")
    ev = compare_tensor(out, ref, 1e9, 1e9)  # even with absurd tolerances
    assert ev is not None and ev["nonfinite"] and ev["where"] == [4]
    both = ref.clone()
    both[2] = float("nan")
    assert compare_tensor(both.clone(), both, None, None) is None


def test_inf_must_match_sign() -> None:
    ref = torch.tensor([float("inf"), 1.0])
    assert compare_tensor(ref.clone(), ref, None, None) is None
    assert compare_tensor(torch.tensor([-float("inf"), 1.0]), ref, None, None) is not None


def test_integers_compare_exactly() -> None:
    ref = torch.arange(6)
    out = ref.clone()
    out[5] += 1
    ev = compare_tensor(out, ref, None, None)
    assert ev is not None and ev["where"] == [5]


def test_tuple_outputs_compared_leaf_by_leaf() -> None:
    ref = (torch.zeros(3), torch.ones(2))
    out = (torch.zeros(3), torch.tensor([1.0, 2.0]))
    ev = compare(out, ref, None, None, 0)
    assert ev is not None and ev["output"] == "output[1]" and ev["where"] == [1]


def test_structure_checks() -> None:
    ref = torch.zeros(4, 4)
    with pytest.raises(_Fail, match="shape"):
        check_structure(torch.zeros(4, 3), ref, 0)
    with pytest.raises(_Fail, match="dtype"):
        check_structure(torch.zeros(4, 4, dtype=torch.float64), ref, 0)
    with pytest.raises(_Fail, match="plain torch.Tensor"):
        check_structure(torch.nn.Parameter(torch.zeros(4, 4)), ref, 0)
    with pytest.raises(_Fail, match="broadcast"):
        check_structure(torch.zeros(1, 4).expand(4, 4), ref, 0)
    with pytest.raises(_Fail, match="2 outputs"):
        check_structure((ref,), (ref, ref), 0)
    check_structure(torch.zeros(4, 4), ref, 0)  # fine


def test_nan_fill_poisons_empty_and_restores_state() -> None:
    was = torch.are_deterministic_algorithms_enabled()
    with nan_fill():
        assert torch.isnan(torch.empty(1000)).all()
        assert (torch.empty(10, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert torch.are_deterministic_algorithms_enabled() == was


def test_poison_cpu_fills_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocks handed back to the allocator hold the pattern (0xFF: NaN in every float format),
    read from the blocks themselves (kept alive here), not a byte count the function reports."""
    made: list[torch.Tensor] = []
    real_empty = torch.empty

    def keeping_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        made.append(t)
        return t

    monkeypatch.setattr(torch, "empty", keeping_empty)
    sizes = [4096, 1 << 20]
    total = poison_free_memory(torch.device("cpu"), sizes)
    monkeypatch.undo()
    assert sorted(t.numel() for t in made) == sorted(sizes * 3) and total == 3 * sum(sizes)
    for block in made:
        assert block.dtype == torch.uint8 and bool((block == 0xFF).all()), "a poisoned block was not filled"
        assert torch.isnan(block[:4096].view(torch.float32)).all() and torch.isnan(block[:64].view(torch.float16)).all()


def test_static_scan_python() -> None:
    src = '''import time, threading
import torch
from torch.utils.cpp_extension import load_inline
# time.perf_counter = fake   (a comment: not flagged)
"""a docstring that says half the grid"""
time.perf_counter = lambda: 0
_cache = {}
cuda_src = """
__global__ void k(float* y) { y[0] = 1; }
torch::Tensor f(torch::Tensor x) { return torch::matmul(x, x); }
"""
class ModelNew(torch.nn.Module):
    def forward(self, x):
        if x.data_ptr() in _cache:
            return _cache[x.data_ptr()]
        s = torch.cuda.Stream()
        return torch.matmul(x, x).half()
'''
    found = static_checks.scan(src, "python")
    by_flag = {(f["flag"], f["line"]) for f in found}
    assert ("timer_patch", 6) in by_flag
    assert ("timer_patch", 4) not in by_flag
    assert ("side_stream", 1) in by_flag and ("side_stream", 16) in by_flag
    assert ("result_cache", 14) in by_flag and ("result_cache", 15) in by_flag
    assert ("torch_fallback", 10) in by_flag  # torch::matmul inside the CUDA string
    assert ("torch_fallback", 17) in by_flag  # torch.matmul in forward beside a kernel
    assert ("precision_lowering", 17) in by_flag
    assert not any(f["line"] == 5 for f in found)  # docstrings are not code


def test_same_file_reference_forward_is_not_a_fallback() -> None:
    src = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
           "ext = load_inline(name='m', cpp_sources='', functions=['f'])\n"
           "class Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.matmul(x, x)\n"
           "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.matmul(x, x)\n")
    lines = {f["line"] for f in static_checks.scan(src, "python") if f["flag"] == "torch_fallback"}
    assert lines == {9}


def test_static_scan_file_writes() -> None:
    src = "import os\nopen(__file__, 'w').write('x')\nos.remove('a')\nwith open(p) as f:\n    pass\nopen(p, 'rb')\n"
    lines = {f["line"] for f in static_checks.scan(src, "python") if f["flag"] == "tampering"}
    assert lines == {2, 3}


def test_static_scan_cuda_and_reference_precision() -> None:
    cu = "#include <cuda_fp16.h>\n__global__ void k(__half* y) {}\nvoid f() { cudaStream_t s; cudaStreamCreate(&s); }\n"
    flags = static_checks.flags(static_checks.scan(cu, "cuda"))
    assert flags == ["precision_lowering", "side_stream"]
    # A half-precision reference excuses half in the candidate.
    assert "precision_lowering" not in static_checks.flags(
        static_checks.scan(cu, "cuda", reference_source="x = torch.randn(4, dtype=torch.float16)"))


def test_static_scan_clean_candidate() -> None:
    src = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp(min=0)\n"
    assert static_checks.scan(src, "python") == []


# -- a launch past the shared-memory limit says which limit ---------------------------------

def test_shared_memory_limit_named_instead_of_invalid_argument() -> None:
    from kernel_lsp.engine.worker.build import launch_limits

    h200 = launch_limits.Limits(per_block=49152, per_block_optin=232448, device="NVIDIA H200")
    src = ("#define TILE 128\n__global__ void k(float* x) { extern __shared__ float s[]; }\n"
           "void go(float* x) {\n  k<<<1, 256, TILE * TILE * 4 * sizeof(float)>>>(x);\n}\n")
    why = launch_limits.explain("the candidate raised RuntimeError: CUDA error: invalid argument", src,
                                {"k": 1024}, h200)
    assert why is not None
    assert "262144 dynamic + 1024 static" in why and "263168 bytes" in why
    assert "per-block opt-in limit of 232448 bytes" in why and "line 4" in why
    # Between 48 KiB and the opt-in limit: the missing cudaFuncSetAttribute is the cause.
    mid = src.replace("TILE * TILE * 4", "TILE * 128")
    why = launch_limits.explain("CUDA error: invalid argument", mid, {}, h200)
    assert "65536 bytes" in why and "without opt-in" in why and "cudaFuncSetAttribute(k" in why
    opted = mid + "// cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536)\n"
    assert launch_limits.explain("CUDA error: invalid argument", opted, {}, h200) is None
    # A size only known at run time is quoted; an unrelated error is left alone.
    runtime = src.replace("TILE * TILE * 4 * sizeof(float)", "n * sizeof(float)")
    assert "`n * sizeof(float)` bytes" in launch_limits.explain("CUDA error: invalid argument", runtime, {}, h200)
    assert launch_limits.explain("CUDA error: invalid argument", runtime, {}, h200, definite_only=True) is None
    assert launch_limits.explain("CUDA error: an illegal memory access", src, {}, h200) is None


def test_the_tasks_own_lines_are_not_the_candidates_cheats():
    """An extracted op's Task imports its model with sys.modules (torch.compile needs it); a
    candidate that keeps the Task's code is not flagged for that line, but the same line in
    ModelNew still is."""
    ref = ("import sys\nimport torch\n"
           "def _load(spec, module):\n    sys.modules[spec.name] = module\n"
           "class Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")
    kept = ref + "\nclass ModelNew(Model):\n    pass\n"
    assert not [f for f in static_checks.scan(kept, "python", ref) if f["flag"] == "tampering"]
    cheat = ref + ("\nclass ModelNew(Model):\n    def forward(self, x):\n"
                   "        sys.modules[spec.name] = module\n        return x * 2\n")
    assert [f["line"] for f in static_checks.scan(cheat, "python", ref) if f["flag"] == "tampering"] == [11]
    assert [f["line"] for f in static_checks.scan(kept, "python", "") if f["flag"] == "tampering"] == [4]
