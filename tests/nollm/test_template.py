"""Max-autotune's Triton GEMM template in the no-LLM writer and the tuner's sweep (CPU: text,
syntax and the engine's static checks).

No recording of a template exists yet: benchmarks/inductor_record.py needs a GPU, and none was lent
when this was written. MODULE below is written here in the form Inductor's output modules give a
template (torch 2.7 and later; read off torch 2.13's select_algorithm.py and
runtime/triton_heuristics.py): a `@triton_heuristics.template(num_stages=.., num_warps=..,
inductor_meta={'grid_type': 'FixedGrid', ...})` decorator, its block sizes as constants in its
body, and a launch whose last three positional arguments are the grid. Its kernel is a plain tiled
GEMM of our own, not Inductor's template text. Replace it with a recording when a GPU is lent:
tests/nollm/test_gpu.py's template test records one (K = 32, level 1 problem 7's shape) into
$KERNEL_LSP_TEST_RECORDINGS/skinny_gemm, in tests/data/inductor's layout.
"""

from __future__ import annotations

import ast

import pytest

from kernel_lsp.engine.worker.judge import static_checks
from kernel_lsp.nollm import sweep
from kernel_lsp.nollm.writer import NotConvertible, write_model_new
from tests.nollm.test_gpu import SKINNY_GEMM

REFERENCE = SKINNY_GEMM  # the GPU test records this one's template

MODULE = """
import torch
from torch._inductor.select_algorithm import extern_kernels
from torch._C import _cuda_getCurrentRawStream as get_raw_stream
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda


# kernel path: /tmp/torchinductor_root/xx/template.py
# Topologically Sorted Source Nodes: [matmul], Original ATen: [aten.mm]
# Source node to ATen node mapping:
#   matmul => mm
# Graph fragment:
#   %arg0_1 : Tensor "f32[4096, 32][32, 1]cuda:0" = PlaceHolder[target=arg0_1]
#   %arg1_1 : Tensor "f32[32, 4096][4096, 1]cuda:0" = PlaceHolder[target=arg1_1]
#   %mm : Tensor "f32[4096, 4096][4096, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%arg0_1, %arg1_1), kwargs = {})
#   return %mm
triton_tem_fused_mm_0 = async_compile.triton('triton_tem_fused_mm_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.template(
    num_stages=5,
    num_warps=4,
    triton_meta={'signature': {'arg_A': '*fp32', 'arg_B': '*fp32', 'out_ptr0': '*fp32'}, 'constants': {}},
    inductor_meta={'kernel_name': 'triton_tem_fused_mm_0', 'max_autotune': True, 'grid_type': 'FixedGrid', 'fixed_grid': ['_grid_0', '_grid_1', '_grid_2'], 'extra_launcher_args': ['_grid_0', '_grid_1', '_grid_2']},
)
@triton.jit
def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):
    BLOCK_M : tl.constexpr = 64
    BLOCK_N : tl.constexpr = 64
    BLOCK_K : tl.constexpr = 32
    M = 4096
    N = 4096
    K = 32
    pid = tl.program_id(0)
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(arg_A + rm[:, None] * K + (k0 + rk)[None, :], mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(arg_B + (k0 + rk)[:, None] * N + rn[None, :], mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, allow_tf32=False)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr0 + rm[:, None] * N + rn[None, :], acc, mask)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    assert_size_stride(arg0_1, (4096, 32), (32, 1))
    assert_size_stride(arg1_1, (32, 4096), (4096, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((4096, 4096), (4096, 1), torch.float32)
        # Topologically Sorted Source Nodes: [matmul], Original ATen: [aten.mm]
        stream0 = get_raw_stream(0)
        triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, 4096, 1, 1, stream=stream0)
        del arg0_1
        del arg1_1
    return (buf0, )
"""


def test_a_gemm_template_becomes_a_plain_triton_kernel_launched_on_its_fixed_grid():
    gen = write_model_new(REFERENCE, MODULE, ["a", "b"], mode="max-autotune")
    (k,) = gen.kernels
    assert k.kind == "template" and k.params == ["arg_A", "arg_B", "out_ptr0"] and k.constexprs == []
    assert gen.configs == {"triton_tem_fused_mm_0": {"num_warps": 4, "num_stages": 5}}  # its decorator's
    src = gen.source
    ast.parse(src)
    assert "@triton.jit\ndef triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):" in src
    assert "    BLOCK_M : tl.constexpr = 64" in src  # its blocks stay in its body
    # launched with its three arguments; the grid is Inductor's, fixed for those blocks
    assert "LAUNCHERS['triton_tem_fused_mm_0'](dev, arg0_1, arg1_1, buf0)" in src
    assert "_Launcher(triton_tem_fused_mm_0, 'triton_tem_fused_mm_0', (), lambda cfg: (4096, 1, 1))" in src
    assert "triton_heuristics" not in src and "torch._inductor" not in src and gen.externs == []
    # the engine's own checks: a custom kernel, and nothing flagged
    assert static_checks.has_kernel(src) and static_checks.flags(static_checks.scan(src, "python", REFERENCE)) == []
    # eager's op can stand in for it (the Search keeps cuBLAS where it is faster)
    assert "triton_tem_fused_mm_0" in gen.eager, gen.eager_why


def test_the_sweep_moves_a_templates_warps_and_pipeline_stages_only():
    gen = write_model_new(REFERENCE, MODULE, ["a", "b"], mode="max-autotune")
    notes = sorted(note for _, note in sweep.variants(gen.source))
    assert notes == ["triton_tem_fused_mm_0: num_stages 5 -> 4", "triton_tem_fused_mm_0: num_warps 4 -> 2",
                     "triton_tem_fused_mm_0: num_warps 4 -> 8"], notes
    for new, _ in sweep.variants(gen.source):
        ast.parse(new)


@pytest.mark.parametrize("change,words", [
    ("triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, 4096, 1, 1, stream=stream0)",
     "template triton_tem_fused_mm_0 is launched with 3 arguments for its 3 parameters and a grid of 3"),
    ("'grid_type': 'FixedGrid'", "template triton_tem_fused_mm_0 uses Inductor's Grid1D launch grid"),
    ("def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):", "takes its blocks at launch"),
])
def test_a_template_the_writer_cannot_launch_is_refused_in_one_sentence(change, words):
    broken = {
        "triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, 4096, 1, 1, stream=stream0)":
            "triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, stream=stream0)",
        "'grid_type': 'FixedGrid'": "'grid_type': 'Grid1D'",
        "def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):":
            "def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0, XBLOCK : tl.constexpr):",
    }[change]
    with pytest.raises(NotConvertible) as e:
        write_model_new(REFERENCE, MODULE.replace(change, broken), ["a", "b"], mode="max-autotune")
    assert words in str(e.value) and "\n" not in str(e.value)
