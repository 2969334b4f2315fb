"""The no-LLM writer on recorded Inductor output (CPU only: the files are checked as text and
syntax, and by the engine's own static checks; running them needs the GPU tests)."""

from __future__ import annotations

import ast
import builtins
import symtable

import pytest

from kernel_lsp.engine.worker.judge import static_checks
from kernel_lsp.nollm.writer import NotConvertible, guess_arg_exprs, write_model_new

from .fixtures import load, recordings

PRIVATE = ("torch._inductor", "triton_helpers", "tl_math", "extern_kernels", "torch.compile",
           "async_compile", "empty_strided_cuda", "reinterpret_tensor", "get_raw_stream", "assert_size_stride")


def _free_globals(source: str) -> set[str]:
    """Names a function in `source` reads as globals that the module never defines."""
    top = symtable.symtable(source, "<generated>", "exec")
    defined = set(top.get_identifiers()) | set(dir(builtins))
    missing: set[str] = set()

    def walk(t: symtable.SymbolTable) -> None:
        for child in t.get_children():
            if child.get_type() == "function":
                for sym in child.get_symbols():
                    if sym.is_global() and sym.is_referenced() and sym.get_name() not in defined:
                        missing.add(sym.get_name())
            walk(child)

    walk(top)
    return missing


@pytest.mark.parametrize("task,module", recordings())
def test_every_recording_converts(task, module):
    ref, code, args = load(task, module)
    gen = write_model_new(ref, code, args, mode=module.rsplit("_", 1)[0])
    tree = ast.parse(gen.source)
    for word in PRIVATE:
        assert word not in gen.source, f"{task}: {word} left in the file"
    assert not _free_globals(gen.source), f"{task}: undefined names {_free_globals(gen.source)}"
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    # ModelNew keeps the reference's constructor (and so its parameters and state_dict keys).
    assert [ast.unparse(b) for b in classes["ModelNew"].bases] == ["Model"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in classes["ModelNew"].body)
    # Every launched kernel is defined once, with a configuration; none is left unused.
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("triton_")]
    assert sorted(defs) == sorted(gen.configs) == sorted({launch.kernel for launch in gen.launches})
    for name in defs:
        assert f"LAUNCHERS[{name!r}](dev, " in gen.source and f"_Launcher({name}, {name!r}, " in gen.source
    # The engine's own checks: Triton kernels are custom kernels; torch's GEMM/convolution
    # calls are flagged as PyTorch work beside them, never hidden.
    flags = static_checks.flags(static_checks.scan(gen.source, "python", ref))
    if defs:
        assert static_checks.has_kernel(gen.source)
    assert ("torch_fallback" in flags) == bool(gen.externs and defs), (task, flags, gen.externs)
    assert "tampering" not in flags and "cuda_graph" not in flags


def test_pointwise_file_reads_like_a_kernel_file():
    ref, code, args = load("bias_gelu")
    gen = write_model_new(ref, code, args)
    src = gen.source
    assert "@triton.jit\ndef triton_poi_fused_add_gelu_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):" in src
    assert "from triton.language.extra import libdevice" in src
    assert "'triton_poi_fused_add_gelu_0': dict(XBLOCK=1024, num_warps=4, num_stages=1)," in src
    assert "with torch.no_grad():\n            arg0_1 = self.bias\n            arg1_1 = x\n            dev = arg1_1.device\n" in src
    assert "LAUNCHERS['triton_poi_fused_add_gelu_0'](dev, arg1_1, arg0_1, buf0, 25165824)" in src
    # The grid is computed once from CONFIGS, as a 3-dim grid for the compiled kernel's runner.
    assert ("'triton_poi_fused_add_gelu_0': _Launcher(triton_poi_fused_add_gelu_0, 'triton_poi_fused_add_gelu_0', "
            "('XBLOCK',), lambda cfg: (triton.cdiv(25165824, cfg['XBLOCK']), 1, 1)),") in src
    # A row-major buffer is a plain torch.empty (empty_strided only where Inductor planned other strides).
    assert "buf0 = torch.empty((8192, 3072), dtype=torch.float32, device=dev)" in src
    assert "empty_strided" not in src
    # Other shapes run the reference's forward.
    assert "tuple(x.shape) != (8192, 3072)" in src and "x.dtype != torch.float32" in src
    assert "x.data_ptr() % 16" in src  # the compiled kernel is specialized on aligned pointers
    assert "return super().forward(x)" in src
    assert gen.shapes == {"x": ((8192, 3072), (3072, 1))}


def test_helpers_are_plain_triton_and_only_those_used():
    ref, code, args = load("softmax")
    src = write_model_new(ref, code, args).source
    for name in ("online_softmax_combine", "online_softmax_reduce", "max2", "maximum"):
        assert f"@triton.jit\ndef {name}(" in src
    assert "def welford(" not in src and "def minimum(" not in src
    ref, code, args = load("layernorm")
    src = write_model_new(ref, code, args).source
    assert "def welford_reduce(" in src and "def welford_combine(" in src and "def welford(" in src


def test_library_calls_become_torch_calls():
    ref, code, args = load("matmul")
    gen = write_model_new(ref, code, args)
    assert gen.externs == ["torch.mm"] and not gen.kernels
    assert "torch.mm(arg0_1, arg1_1, out=buf0)" in gen.source
    ref, code, args = load("l2_conv3d_mish_tanh")
    gen = write_model_new(ref, code, args)
    assert gen.externs == ["torch.convolution"]
    assert "torch.convolution(" in gen.source and "self.conv.weight" in gen.source
    ref, code, args = load("l2_gemm_div_sum")
    src = write_model_new(ref, code, args).source
    assert "torch.mm(arg1_1, torch.as_strided(arg0_1, (10, 20), (1, 10), 0), out=buf0)" in src


def test_max_autotune_partitions_are_inlined():
    ref, code, args = load("relu", "max-autotune_0.py")
    src = write_model_new(ref, code, args, mode="max-autotune").source
    assert "partition" not in src.split("class ModelNew")[1]
    assert "LAUNCHERS['triton_poi_fused_relu_0'](dev, " in src and "return buf0" in src


def test_two_dimensional_grid():
    ref, code, args = load("mingpt_block")
    gen = write_model_new(ref, code, args)
    assert len(gen.kernels) == 9 and gen.externs == ["torch.bmm", "torch.mm"]
    assert ("_Launcher(triton_poi_fused_addmm_clone_split_transpose_view_2, "
            "'triton_poi_fused_addmm_clone_split_transpose_view_2', ('YBLOCK', 'XBLOCK'), "
            "lambda cfg: (triton.cdiv(512, cfg['XBLOCK']), triton.cdiv(24576, cfg['YBLOCK']), 1)),") in gen.source


def test_recorded_configs_are_kept_when_the_kernel_can_take_them():
    ref, code, args = load("bias_gelu")
    rec = {"triton_poi_fused_add_gelu_0": {"kwargs": {"XBLOCK": 512}, "num_warps": 8, "num_stages": 1}}
    assert write_model_new(ref, code, args, rec).configs["triton_poi_fused_add_gelu_0"] == \
        {"XBLOCK": 512, "num_warps": 8, "num_stages": 1}
    # No bounds mask on x (25165824 = 3 * 2**23): a block that does not divide it is refused.
    bad = {"triton_poi_fused_add_gelu_0": {"kwargs": {"XBLOCK": 3}, "num_warps": 2, "num_stages": 1}}
    assert write_model_new(ref, code, args, bad).configs["triton_poi_fused_add_gelu_0"]["XBLOCK"] == 1024


def _one_line(exc: NotConvertible) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 300 and "Traceback" not in text
    return text


def test_graph_breaks_are_refused_in_one_sentence():
    ref, code, args = load("relu")
    with pytest.raises(NotConvertible) as e:
        write_model_new(ref, [code, code], args)
    assert "2 graphs (graph breaks)" in _one_line(e.value)


def test_dynamic_shapes_are_refused():
    ref, code, args = load("relu")
    dyn = code.replace("triton_poi_fused_relu_0.run(arg0_1, buf0, 16777216,", "triton_poi_fused_relu_0.run(arg0_1, buf0, s0,")
    assert dyn != code
    with pytest.raises(NotConvertible) as e:
        write_model_new(ref, dyn, args)
    assert "dynamic" in _one_line(e.value)


def test_unknown_private_helper_is_named():
    ref, code, args = load("relu")
    odd = code.replace("tmp2 = triton_helpers.maximum(tmp1, tmp0)", "tmp2 = triton_helpers.bucketize_binary_search(tmp1, tmp0)")
    assert odd != code
    with pytest.raises(NotConvertible) as e:
        write_model_new(ref, odd, args)
    assert "triton_helpers.bucketize_binary_search" in _one_line(e.value)


def test_a_template_without_its_fixed_grid_and_other_backends_are_refused():
    ref, code, args = load("relu")
    with pytest.raises(NotConvertible) as e:  # (test_template.py: a template the writer converts)
        write_model_new(ref, code.replace("@triton_heuristics.pointwise(", "@triton_heuristics.template("), args)
    assert "template triton_poi_fused_relu_0 uses Inductor's Grid1D launch grid" in _one_line(e.value)
    with pytest.raises(NotConvertible) as e:
        write_model_new(ref, code.replace("@triton_heuristics.pointwise(", "@triton_heuristics.foreach("), args)
    assert "is an Inductor foreach kernel" in _one_line(e.value)
    with pytest.raises(NotConvertible) as e:
        write_model_new(ref, code.replace("async_compile.wait(globals())",
                                          "cpp_fused_0 = async_compile.cpp_pybinding(['x'], '''x''')\n"
                                          "async_compile.wait(globals())"), args)
    assert "cpp_pybinding" in _one_line(e.value)


def test_shape_guess_refuses_ambiguous_parameters():
    with pytest.raises(NotConvertible) as e:
        guess_arg_exprs(["arg0_1", "arg1_1", "arg2_1"],
                        {"arg0_1": ((8,), (1,)), "arg1_1": ((8,), (1,)), "arg2_1": ((4, 8), (8, 1))},
                        ["x"], {"norm.weight": (8,), "norm.bias": (8,)})
    assert "norm.weight" in _one_line(e.value)
    assert guess_arg_exprs(["arg0_1", "arg1_1"], {"arg0_1": ((8,), (1,)), "arg1_1": ((4, 8), (8, 1))},
                           ["x"], {"bias": (8,)}) == ["self.bias", "x"]


def test_not_a_reference():
    _, code, _ = load("relu")
    with pytest.raises(NotConvertible) as e:
        write_model_new("import torch\n", code, ["x"])
    assert "no class Model" in _one_line(e.value)


def test_future_imports_stay_first():
    ref, code, args = load("relu")
    ref = '"""A docstring."""\nfrom __future__ import annotations\n' + ref
    src = write_model_new(ref, code, args).source
    ast.parse(src)
    assert src.count("from __future__ import annotations") == 1


def test_lean_forward_on_the_split_softmax():
    """KernelBench l1_p23 (softmax, 16 x 16384; the H200 read the older file at 0.07x eager): five
    launches, one program per block (no launch per row), grids computed once outside the forward, no
    per-call configuration lookup, allocation through torch.empty."""
    import re

    ref, code, args = load("l1_softmax_split")
    gen = write_model_new(ref, code, args)
    fwd = gen.source.split("class ModelNew(Model):", 1)[1]
    assert fwd.count("LAUNCHERS['") == 5 and len(gen.kernels) == 5
    for word in ("CONFIGS", "triton.cdiv", "empty_strided", "cfg", "**"):
        assert word not in fwd, word
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    ns = {"triton": type("T", (), {"cdiv": staticmethod(cdiv)}), "CONFIGS": {}}
    exec(gen.source[gen.source.index("CONFIGS = {"):gen.source.index("\n}\n") + 3], ns)  # noqa: S102
    grids = {m.group(1): eval(m.group(2), ns)(ns["CONFIGS"][m.group(1)])  # noqa: S307
             for m in re.finditer(r"^    '(\w+)': _Launcher\(\w+, '\w+', \([^)]*\), (lambda cfg: .*)\),$", gen.source, re.M)}
    assert grids == {"triton_red_fused_prepare_softmax_online_0": (32, 1, 1),
                     "triton_per_fused_prepare_softmax_online_1": (1, 1, 1),
                     "triton_red_fused_prepare_softmax_online_2": (32, 1, 1),
                     "triton_per_fused_prepare_softmax_online_3": (1, 1, 1),
                     "triton_poi_fused__softmax_exp_sub_4": (256, 1, 1)}
