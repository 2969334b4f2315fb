"""The examples: every .cu compiles (check and fast build), every harness follows the
contract in docs/architecture.md, tunable variants stay valid, and on a GPU each kernel
matches its Model."""

from __future__ import annotations

import ast
import asyncio
import ctypes
import importlib.util
import os
import re
import sys

import pytest

from kernel_lsp.toolchain import CompileOptions, build_library, compile_check, find_nvcc, torch_include_paths

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
CU_FILES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".cu"))
STEMS = [f[:-3] for f in CU_FILES]
INLINE_TASKS = ["relu_scale_inline.py", "row_softmax_inline.py"]
NVCC = find_nvcc(None)
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)

# Values the tuner may try: each must still compile (and, on a GPU, still be correct).
VARIANTS = {
    "softmax": [{"BLOCK_SIZE": "256"}, {"BLOCK_SIZE": "1024"}],
    "layernorm": [{"BLOCK_SIZE": "512"}],
    "matmul": [{"TILE": "16"}, {"TILE": "32"}],
    "bias_gelu": [{"BLOCK_SIZE": "256", "ITEMS_PER_THREAD": "4"}],
    "reduce_sum": [{"BLOCK_SIZE": "256", "UNROLL": "4"}, {"BLOCK_SIZE": "64", "UNROLL": "3"}],
}
# float32 tolerances per example (matmul and sums accumulate over thousands of terms).
TOLERANCE = {"matmul": (1e-3, 1e-3), "reduce_sum": (1e-4, 1e-3), "layernorm": (1e-4, 1e-4)}


def read(name: str) -> str:
    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
        return f.read()


def extern_c_functions(source: str) -> set[str]:
    return set(re.findall(r'extern\s+"C"\s+\w[\w\s*]*?\b(\w+)\s*\(', source))


def test_there_are_enough_examples():
    assert {"softmax", "layernorm", "matmul", "bias_gelu", "reduce_sum"} <= set(STEMS)
    for stem in STEMS:
        assert os.path.isfile(os.path.join(EXAMPLES, stem + ".py")), f"{stem}.cu has no harness"
    assert os.path.isfile(os.path.join(EXAMPLES, "README.md"))
    readme = read("README.md")
    for name in CU_FILES + INLINE_TASKS:
        assert name in readme


@pytest.mark.parametrize("stem", STEMS)
def test_harness_follows_the_contract(stem):
    tree = ast.parse(read(stem + ".py"))
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert isinstance(top.get("Model"), ast.ClassDef)
    assert {"get_inputs", "get_init_inputs", "kernel_forward"} <= set(top)
    entry = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "ENTRY" for t in n.targets)]
    assert len(entry) == 1
    assert entry[0] in extern_c_functions(read(stem + ".cu"))
    args = top["kernel_forward"].args
    assert [a.arg for a in args.args[:2]] == ["lib", "model"]
    assert len(args.args) > 2 or args.vararg is not None
    # It calls the launcher it names, and passes the current stream.
    body = ast.unparse(top["kernel_forward"])
    assert f"lib.{entry[0]}(" in body and "current_stream().cuda_stream" in body
    # Never time on zeros: inputs are random.
    assert "torch.randn" in ast.unparse(top["get_inputs"])


@pytest.mark.parametrize("stem", STEMS)
def test_launcher_takes_a_stream_and_tunables_have_defaults(stem):
    source = read(stem + ".cu")
    assert "cudaStream_t stream" in source and ", stream>>>" in source
    for name in {k for variant in VARIANTS[stem] for k in variant}:
        assert re.search(rf"#ifndef {name}\n#define {name} \d+", source), f"{stem}.cu: {name} not overridable"


@needs_nvcc
@pytest.mark.parametrize("stem", STEMS)
async def test_example_compiles_cleanly(stem):
    path = os.path.join(EXAMPLES, stem + ".cu")
    result = await compile_check(read(stem + ".cu"), path=path, options=CompileOptions(nvcc=NVCC))
    assert result.ok, result.log
    assert result.diagnostics == []
    assert result.resources, "ptxas reported no kernel"
    for res in result.resources:
        assert res.spill_stores == 0 and res.spill_loads == 0
        assert res.threads_per_block is not None  # every example states __launch_bounds__
        assert res.occupancy and res.occupancy > 0


@needs_nvcc
async def test_tuner_variants_compile():
    jobs = []
    for stem, variants in VARIANTS.items():
        for defines in variants:
            jobs.append(compile_check(read(stem + ".cu"), path=os.path.join(EXAMPLES, stem + ".cu"),
                                      options=CompileOptions(nvcc=NVCC, defines=dict(defines))))
    for result in await asyncio.gather(*jobs):
        assert result.ok and not result.diagnostics, result.log
        assert all(r.spill_stores == 0 for r in result.resources)


@needs_nvcc
@pytest.mark.parametrize("stem", STEMS)
def test_example_builds_a_library_with_its_entry(stem, tmp_path):
    out = tmp_path / f"{stem}.so"
    result = build_library(read(stem + ".cu"), out_path=str(out), options=CompileOptions(nvcc=NVCC),
                           timeout=300, path=os.path.join(EXAMPLES, stem + ".cu"))
    assert result.ok, result.log
    entry = _entry(stem)
    assert hasattr(ctypes.CDLL(str(out)), entry)


def _entry(stem: str) -> str:
    tree = ast.parse(read(stem + ".py"))
    return next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "ENTRY" for t in n.targets))


# ------------------------------------------------------------------ load_inline tasks


def embedded_cuda(name: str) -> list[tuple[str, int]]:
    """(text, 0-based line of the string's first character) of each CUDA source string."""
    tree = ast.parse(read(name))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
            out.append((node.value, node.lineno - 1))
    return out


@pytest.mark.parametrize("name", INLINE_TASKS)
def test_inline_task_is_kernelbench_format(name):
    tree = ast.parse(read(name))
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"Model", "ModelNew", "get_inputs", "get_init_inputs"} <= top
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "load_inline"]
    assert len(calls) == 1
    keywords = {k.arg for k in calls[0].keywords}
    assert {"name", "cpp_sources", "cuda_sources", "functions"} <= keywords
    assert len(embedded_cuda(name)) == 1


@needs_nvcc
@pytest.mark.slow
@pytest.mark.skipif(not torch_include_paths(), reason="needs torch's C++ headers")
async def test_inline_sources_compile_with_torch_headers():
    # One nvcc per source, concurrently: each parses torch/extension.h (tens of seconds).
    jobs = []
    for name in INLINE_TASKS:
        [(text, first_line)] = embedded_cuda(name)
        jobs.append(compile_check(text, path=os.path.join(EXAMPLES, name),
                                  options=CompileOptions(nvcc=NVCC, torch_headers=True), timeout=600,
                                  line_map=lambda line, col, base=first_line: (line + base, col)))
    for name, result in zip(INLINE_TASKS, await asyncio.gather(*jobs)):
        assert result.ok, f"{name}: {result.log[-3000:]}"
        assert [d for d in result.diagnostics if d.severity == "error"] == []
        assert len(result.resources) == 1 and result.resources[0].kernel.endswith("_kernel")


# ------------------------------------------------------------------ on the GPU


def _load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _variants(stem: str) -> list[dict[str, str]]:
    return [{}] + VARIANTS.get(stem, [])


@pytest.mark.gpu
@needs_nvcc
@pytest.mark.parametrize("stem", STEMS)
def test_example_matches_its_model_on_the_gpu(stem, tmp_path):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    harness = _load_module(os.path.join(EXAMPLES, stem + ".py"), f"example_{stem}")
    rtol, atol = TOLERANCE.get(stem, (1e-4, 1e-5))
    for i, defines in enumerate(_variants(stem)):
        out_path = tmp_path / f"{stem}_{i}.so"
        result = build_library(read(stem + ".cu"), out_path=str(out_path),
                               options=CompileOptions(nvcc=NVCC, defines=dict(defines)), timeout=300,
                               path=os.path.join(EXAMPLES, stem + ".cu"))
        assert result.ok, result.log
        lib = ctypes.CDLL(str(out_path))
        torch.manual_seed(1234)
        model = harness.Model(*harness.get_init_inputs()).cuda().eval()
        for seed in (0, 1, 2):  # fresh random inputs each time
            torch.manual_seed(100 + seed)
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in harness.get_inputs()]
            assert all(x.is_cuda for x in inputs if isinstance(x, torch.Tensor))
            before = [x.clone() for x in inputs if isinstance(x, torch.Tensor)]
            with torch.no_grad():
                expected = model(*inputs)
                got = harness.kernel_forward(lib, model, *inputs)
            torch.cuda.synchronize()
            assert got.shape == expected.shape and got.dtype == expected.dtype
            torch.testing.assert_close(got, expected, rtol=rtol, atol=atol,
                                       msg=lambda m: f"{stem} {defines or 'defaults'} seed {seed}: {m}")
            for a, b in zip(before, [x for x in inputs if isinstance(x, torch.Tensor)]):
                assert torch.equal(a, b), f"{stem} changed its input"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", INLINE_TASKS)
def test_inline_candidate_matches_model_on_the_gpu(name):
    import torch

    module = _load_module(os.path.join(EXAMPLES, name), "inline_" + name[:-3])  # builds with load_inline
    torch.manual_seed(0)
    init = module.get_init_inputs()
    model, candidate = module.Model(*init).cuda(), module.ModelNew(*init).cuda()
    for seed in (0, 1):
        torch.manual_seed(seed)
        inputs = [x.cuda() for x in module.get_inputs()]
        with torch.no_grad():
            torch.testing.assert_close(candidate(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
