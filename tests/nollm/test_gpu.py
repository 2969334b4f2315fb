"""The no-LLM path on a real GPU: a generated file for a pointwise and a GEMM reference builds,
is judged correct by the engine (`kernel-lsp bench`), and runs in a fresh process with an empty
Inductor cache and nothing of torch._inductor in it; `optimize --proposer tuner` on a module
finds a candidate through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

POINTWISE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return F.gelu(x + self.bias) * 0.5


def get_inputs():
    return [torch.randn(4096, 2048, device="cuda")]


def get_init_inputs():
    return [2048]
'''

GEMM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.linear = nn.Linear(k, n)

    def forward(self, x):
        y = self.linear(x)
        return y * torch.sigmoid(y)


def get_inputs():
    return [torch.randn(1024, 1024, device="cuda")]


def get_init_inputs():
    return [1024, 2048]
'''

RUN = '''
import importlib.util, os, sys, torch
spec = importlib.util.spec_from_file_location("gen", sys.argv[1])
gen = importlib.util.module_from_spec(spec); spec.loader.exec_module(gen)
torch.manual_seed(1)
ref = gen.Model(*gen.get_init_inputs()).cuda().eval()
new = gen.ModelNew(*gen.get_init_inputs()).cuda().eval()
assert set(new.state_dict()) == set(ref.state_dict())
new.load_state_dict(ref.state_dict())
with torch.no_grad():
    for seed in (2, 3):
        torch.manual_seed(seed)
        xs = gen.get_inputs()
        want, got = ref(*xs), new(*xs)
        torch.cuda.synchronize()
        assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), (got - want).abs().max().item()
print("inductor-modules", sorted(m for m in sys.modules if m.startswith("torch._inductor")))
'''


def _generate(tmp_path: Path, name: str, source: str) -> Path:
    from kernel_lsp.engine.worker.inductor_code import record
    from kernel_lsp.nollm.proposer import convert_recording

    rec = record(source, ("default",))
    assert "why" not in rec, rec
    gens, why = convert_recording(source, rec)
    assert "default" in gens, why
    path = tmp_path / f"{name}_nollm.py"
    path.write_text(gens["default"].source)
    return path


@pytest.mark.parametrize("name,source", [("pointwise", POINTWISE), ("gemm", GEMM)])
def test_generated_file_stands_alone_and_is_judged_correct(tmp_path, name, source):
    path = _generate(tmp_path, name, source)
    text = path.read_text()
    assert "torch._inductor" not in text and "torch.compile" not in text and "@triton.jit" in text
    cache = tmp_path / "empty_inductor_cache"
    cache.mkdir()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    r = subprocess.run([sys.executable, "-c", RUN, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "inductor-modules []" in r.stdout, r.stdout
    assert not any(cache.iterdir()), "Inductor wrote to its cache: something compiled through it"
    # The engine judges it like any other candidate (its own Model is the reference).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", path.name, "--json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=500)
    doc = json.loads(r.stdout)
    (t,) = doc["targets"]
    assert r.returncode == 0 and t["verdict"] == "correct", (t, r.stderr[-2000:])
    if name == "pointwise":
        assert t["custom_kernel"] is True  # Triton kernels only
    else:
        # torch.mm beside the Triton epilogue: the engine calls that PyTorch's work, not a kernel's.
        assert t["custom_kernel"] is False and "PyTorch rewrite" in t["label"], t


def test_optimize_a_module_with_the_tuner(tmp_path):
    (tmp_path / "plain.py").write_text(POINTWISE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "optimize", "plain.py", "--proposer", "tuner",
                        "--budget", "6", "--json", "--out", "best.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=580)
    doc = json.loads(r.stdout)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    evaluated = [e for e in doc["evaluations"] if e["candidate"] != doc["start"]]
    assert evaluated, doc["reason"]
    assert any(e["verdict"] == "correct" for e in evaluated), doc["failed_steps"]
    if r.returncode == 0:
        assert doc["generated"].startswith("Triton kernels generated from torch.compile")
        assert "@triton.jit" in (tmp_path / "best.py").read_text()


SOFTMAX = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(16, 16384, device="cuda")]


def get_init_inputs():
    return []
'''

GRAPHED_CALLS = '''
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("gen", sys.argv[1])
gen = importlib.util.module_from_spec(spec); spec.loader.exec_module(gen)
torch.manual_seed(1)
ref = gen.Model(*gen.get_init_inputs()).cuda().eval()
new = gen.ModelNew(*gen.get_init_inputs()).cuda().eval()
new.load_state_dict(ref.state_dict())
outs = []
with torch.no_grad():
    for seed in (2, 3, 4):
        torch.manual_seed(seed)
        xs = gen.get_inputs()
        want, got = ref(*xs), new(*xs)
        torch.cuda.synchronize()
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max().item()
        outs.append(got)
assert len(gen._GRAPHS.graphs) == 1 and gen._GRAPHS.graphs and all(v is not False for v in gen._GRAPHS.graphs.values())
ptrs = {o.data_ptr() for o in outs}
assert len(ptrs) == 3, "a call returned storage another call returned"
assert not torch.equal(outs[0], outs[1]), "a result was reused across calls"
# A module given new parameter tensors is captured again (its storage is part of the key).
for name, p in list(new.named_parameters()):
    setattr(new, name.split(".")[-1], torch.nn.Parameter(p.detach().clone()))
with torch.no_grad():
    new(*xs)
print("graphs", len(gen._GRAPHS.graphs))
'''


def _bench(tmp_path: Path, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", path.name, "--json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=500)
    doc = json.loads(r.stdout)
    (t,) = doc["targets"]
    return t


def test_graphed_variant_is_correct_fresh_each_call_and_flagged(tmp_path):
    """The CUDA-graph variant through the engine: correct on fresh inputs, poisoned outputs and
    the cross-call checks; flagged `cuda_graph` (so not counted) by the engine's own rule."""
    from kernel_lsp.nollm import graphs

    path = _generate(tmp_path, "pointwise", POINTWISE)
    graphed = tmp_path / "pointwise_graphed.py"
    graphed.write_text(graphs.graphed(path.read_text()))
    r = subprocess.run([sys.executable, "-c", GRAPHED_CALLS, str(graphed)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "graphs 2" in r.stdout, r.stderr[-3000:]
    t = _bench(tmp_path, graphed)
    assert t["verdict"] == "correct", t
    assert "cuda_graph" in (t.get("flags") or []), t


def test_eager_op_variant_and_lean_launch_on_the_split_softmax(tmp_path):
    """KernelBench l1_p23's softmax: the generated file (five kernels, lean launches) and its variant
    with the last kernel left to eager ATen ops are both judged correct by the engine."""
    from kernel_lsp.engine.worker.inductor_code import record
    from kernel_lsp.nollm import eager_ops
    from kernel_lsp.nollm.proposer import convert_recording

    rec = record(SOFTMAX, ("default",))
    gens, why = convert_recording(SOFTMAX, rec)
    gen = gens["default"]
    (tmp_path / "sm_nollm.py").write_text(gen.source)
    t = _bench(tmp_path, tmp_path / "sm_nollm.py")
    assert t["verdict"] == "correct" and t["custom_kernel"] is True, t
    assert gen.eager, gen.eager_why
    op = next(iter(gen.eager.values()))
    variant = eager_ops.apply(gen.source, op)
    assert variant is not None and eager_ops.kept_count(variant) == 1
    (tmp_path / "sm_eager.py").write_text(variant)
    t = _bench(tmp_path, tmp_path / "sm_eager.py")
    # Eager's ops beside the kernels are PyTorch's work: flagged as torch.mm beside kernels is.
    assert t["verdict"] == "correct" and t["custom_kernel"] is False and "torch_fallback" in t["flags"], t


SKINNY_GEMM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B with K = 32 (KernelBench level 1 problem 7's shape, smaller): memory-bound."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(4096, 32, device="cuda"), torch.randn(32, 4096, device="cuda")]


def get_init_inputs():
    return []
'''


def test_a_max_autotune_gemm_template_is_written_as_a_triton_kernel_and_judged_correct(tmp_path):
    """The first recording of a max-autotune Triton template (Triton's GEMM only, so that the
    template is what Inductor picks): the writer's file launches it on Inductor's fixed grid, runs
    alone with nothing of torch._inductor, and the engine judges it a custom kernel, correct."""
    import torch._inductor.config as inductor_config

    from kernel_lsp.engine.worker.inductor_code import record
    from kernel_lsp.nollm.proposer import convert_recording

    with inductor_config.patch(max_autotune_gemm_backends="TRITON"):
        rec = record(SKINNY_GEMM, ("max-autotune",))
    assert "why" not in rec and "error" not in rec["modes"]["max-autotune"], rec
    (code,) = rec["modes"]["max-autotune"]["codes"]
    # The recording, for tests/data/inductor (the CPU tests' fixtures): $KERNEL_LSP_TEST_RECORDINGS
    # names a folder that outlives the test (on the device: one under $OUT).
    keep = Path(os.environ.get("KERNEL_LSP_TEST_RECORDINGS") or tmp_path) / "skinny_gemm"
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "reference.py").write_text(SKINNY_GEMM)
    (keep / "max-autotune_0.py").write_text(code)
    (keep / "max-autotune.json").write_text(json.dumps({k: v for k, v in rec["modes"]["max-autotune"].items()
                                                        if k != "codes"}, indent=1))
    assert "@triton_heuristics.template(" in code, code[:2000]
    gens, why = convert_recording(SKINNY_GEMM, rec)
    assert "max-autotune" in gens, why
    gen = gens["max-autotune"]
    assert any(k.kind == "template" for k in gen.kernels) and gen.externs == []
    path = tmp_path / "skinny_nollm.py"
    path.write_text(gen.source)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty_inductor_cache"),
           "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    r = subprocess.run([sys.executable, "-c", RUN, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "inductor-modules []" in r.stdout, r.stdout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", path.name, "--json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=500)
    (t,) = json.loads(r.stdout)["targets"]
    assert r.returncode == 0 and t["verdict"] == "correct" and t["custom_kernel"] is True, (t, r.stderr[-2000:])


def _keep_recording(name: str, reference: str, rec: dict, tmp_path: Path) -> None:
    """The recording, for tests/data/inductor (the CPU tests' fixtures): $KERNEL_LSP_TEST_RECORDINGS
    names a folder that outlives the test (on the device: one under $OUT)."""
    keep = Path(os.environ.get("KERNEL_LSP_TEST_RECORDINGS") or tmp_path) / name
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "reference.py").write_text(reference)
    for mode, row in rec["modes"].items():
        for i, code in enumerate(row.get("codes") or []):
            (keep / f"{mode}_{i}.py").write_text(code)
        (keep / f"{mode}.json").write_text(json.dumps({k: v for k, v in row.items() if k != "codes"}, indent=1))


def test_the_unsplit_reductions_variant_of_the_split_softmax(tmp_path):
    """KernelBench l1_p23's softmax (16 x 16384), recorded with Inductor's reductions split (its
    default: five kernels) and not split: the variant is other code with fewer kernels, written as
    a standalone file the engine judges correct; a variant that changes nothing is `same_as`."""
    from kernel_lsp.engine.worker.inductor_code import VARIANTS, record
    from kernel_lsp.nollm.proposer import convert_recording

    modes = ("default", *VARIANTS)
    rec = record(SOFTMAX, modes)
    _keep_recording("l1_softmax_variants", SOFTMAX, rec, tmp_path)
    assert "why" not in rec, rec
    rows = rec["modes"]
    assert not rows["default"].get("error") and not rows["default-unsplit-reductions"].get("error"), rows
    assert "same_as" not in rows["default-unsplit-reductions"], "no split reductions changed nothing"
    gens, why = convert_recording(SOFTMAX, rec)
    assert "default-unsplit-reductions" in gens, why
    split, unsplit = gens["default"], gens["default-unsplit-reductions"]
    assert len(unsplit.kernels) < len(split.kernels) == 5, [k.name for k in unsplit.kernels]
    assert "mode 'default, reductions not split')" in unsplit.source
    path = tmp_path / "sm_unsplit.py"
    path.write_text(unsplit.source)
    t = _bench(tmp_path, path)
    assert t["verdict"] == "correct" and t["custom_kernel"] is True, t
    for mode in VARIANTS:  # each either other code or said to be the default's
        assert mode in gens or why.get(mode), (mode, why)
    # Past its time, a variant is not started, and says so.
    late = record(SOFTMAX, ("default", "default-unsplit-reductions"), variants_within_s=0.0)
    assert late["modes"]["default"]["codes"], late
    assert late["modes"]["default-unsplit-reductions"]["error"].startswith("not recorded: the recording had taken")
