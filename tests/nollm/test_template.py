"""Max-autotune's Triton GEMM template in the no-LLM writer and the tuner's sweep (CPU: text,
syntax and the engine's static checks), on a recording: tests/data/inductor/skinny_gemm, made by
tests/nollm/test_gpu.py's template test on an H100 (torch 2.11, Triton 3.6; K = 32, level 1
problem 7's shape, Triton's GEMM only so that the template is what Inductor picks). Its template:
`@triton_heuristics.template(num_stages=2, num_warps=4, inductor_meta={'grid_type': 'FixedGrid',
...})`, its block sizes as constants in its body, and a launch whose last three positional
arguments are the grid.
"""

from __future__ import annotations

import ast

import pytest

from kernel_lsp.engine.worker.judge import static_checks
from kernel_lsp.nollm import sweep
from kernel_lsp.nollm.writer import NotConvertible, write_model_new
from tests.nollm.test_gpu import SKINNY_GEMM

from .fixtures import load

REFERENCE, MODULE, ARGS = load("skinny_gemm", "max-autotune_0.py")


def test_the_recording_is_the_gpu_tests_task():
    assert REFERENCE == SKINNY_GEMM and ARGS == ["a", "b"]  # one owner: re-record when it changes


def test_a_gemm_template_becomes_a_plain_triton_kernel_launched_on_its_fixed_grid():
    gen = write_model_new(REFERENCE, MODULE, ARGS, mode="max-autotune")
    (k,) = gen.kernels
    assert k.kind == "template" and k.params == ["arg_A", "arg_B", "out_ptr0"] and k.constexprs == []
    assert gen.configs == {"triton_tem_fused_mm_0": {"num_warps": 4, "num_stages": 2}}  # its decorator's
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
    gen = write_model_new(REFERENCE, MODULE, ARGS, mode="max-autotune")
    notes = sorted(note for _, note in sweep.variants(gen.source))
    assert notes == ["triton_tem_fused_mm_0: num_stages 2 -> 1", "triton_tem_fused_mm_0: num_stages 2 -> 3",
                     "triton_tem_fused_mm_0: num_warps 4 -> 2", "triton_tem_fused_mm_0: num_warps 4 -> 8"], notes
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
        write_model_new(REFERENCE, MODULE.replace(change, broken), ARGS, mode="max-autotune")
    assert words in str(e.value) and "\n" not in str(e.value)
