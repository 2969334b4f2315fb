"""The generated files' Triton code run by Triton's interpreter (TRITON_INTERPRET=1, on the CPU;
skipped where Triton or numpy is not installed, a failure under .ci/run: tests/needs.py): the
helpers written for the files against torch on the same data, and recorded fixtures' whole files
(their lean forward) against their references. The interpreter has no libdevice, so
libdevice.exp reads tl.exp here (the GPU tests run the real one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import needs_triton, triton_path

pytestmark = needs_triton
ROOT = Path(__file__).resolve().parents[2]

HELPERS = r'''
import os, sys
import torch, triton, triton.language as tl
from kernel_lsp.nollm.helpers import HELPERS, closure
names = closure({"online_softmax_combine", "online_softmax_reduce", "welford_reduce", "welford", "min_with_index", "max2", "min2"})
src = "\n".join(HELPERS[n][0] for n in names).replace("libdevice.exp(", "tl.exp(")
exec(src)

@triton.jit
def k(x_ptr, o_ptr, N: tl.constexpr, R: tl.constexpr):
    base = tl.arange(0, R)[None, :]
    m = tl.full([1, R], float('-inf'), tl.float32)
    s = tl.zeros([1, R], tl.float32)
    mean = tl.zeros([1, R], tl.float32)
    m2 = tl.zeros([1, R], tl.float32)
    w = tl.zeros([1, R], tl.float32)
    bv = tl.full([1, R], float('inf'), tl.float32)
    bi = tl.zeros([1, R], tl.int64)
    for off in tl.range(0, N, R):
        idx = off + base
        mask = idx < N
        v = tl.load(x_ptr + idx, mask, other=0.0)
        mn, sn = online_softmax_combine(m, s, v, False)
        m = tl.where(mask, mn, m)
        s = tl.where(mask, sn, s)
        a, b, c = welford_reduce(v, mean, m2, w, off == 0)
        mean = tl.where(mask, a, mean)
        m2 = tl.where(mask, b, m2)
        w = tl.where(mask, c, w)
        vv = tl.where(mask, v, float('inf'))
        take = vv < bv
        bi = tl.where(take, idx.to(tl.int64), bi)
        bv = tl.where(take, vv, bv)
    mx, sm = online_softmax_reduce(m, s, 1, False)
    mu, mm2, ww = welford(mean, m2, w, 1)
    _, imin = min_with_index(bv, bi, 1)
    tl.store(o_ptr + 0 + tl.arange(0, 1), mx)
    tl.store(o_ptr + 1 + tl.arange(0, 1), sm)
    tl.store(o_ptr + 2 + tl.arange(0, 1), mu)
    tl.store(o_ptr + 3 + tl.arange(0, 1), mm2 / ww)
    tl.store(o_ptr + 4 + tl.arange(0, 1), imin.to(tl.float32))
    tl.store(o_ptr + 5 + tl.arange(0, 1), max2(mean, 1) * 0 + min2(bv, 1))

x = torch.randn(100) * 3
o = torch.empty(6)
k[(1,)](x, o, N=100, R=16)
want = [x.max().item(), torch.exp(x - x.max()).sum().item(), x.mean().item(), x.var(unbiased=False).item(), float(x.argmin()), x.min().item()]
print([round(v, 5) for v in o.tolist()]); print([round(v, 5) for v in want])
assert torch.allclose(o, torch.tensor(want), rtol=1e-4, atol=1e-4)
print("helpers ok")
'''

FIXTURE = r'''
import sys, torch
from tests.nollm.fixtures import load
from kernel_lsp.nollm.writer import write_model_new
ref, code, args = load(sys.argv[1])
gen = write_model_new(ref, code, args)
src = gen.source
if len(sys.argv) > 2 and sys.argv[2] in ("paired-first", "paired-last"):
    # every kernel at once moved by its first (or last) paired launch move of the tuner's sweep
    from kernel_lsp.nollm import sweep
    moved = 0
    for name, cfg in sweep.configs(src).items():
        moves = sweep.paired(sweep.kernel_facts(src, name), cfg)
        if moves:
            src = sweep.with_config(src, name, moves[0 if sys.argv[2] == "paired-first" else -1][0])
            moved += 1
    assert moved, "no paired move"
    print("moved", moved, sweep.configs(src))
elif len(sys.argv) > 2:  # a variant: that kernel left to eager's ATen ops
    from kernel_lsp.nollm import eager_ops
    src = eager_ops.apply(src, gen.eager[sys.argv[2]])
src = src.replace("not x.is_cuda", "False")  # the interpreter runs on CPU tensors
src = src.replace("libdevice.exp(", "tl.exp(")
ns = {"__name__": "generated"}
exec(compile(src, "generated", "exec"), ns)
torch.manual_seed(0)
m = ns["Model"](*ns["get_init_inputs"]())
n = ns["ModelNew"](*ns["get_init_inputs"]())
n.load_state_dict(m.state_dict())
for seed in (1, 2):
    torch.manual_seed(seed)
    xs = ns["get_inputs"]()
    with torch.no_grad():
        err = (n(*xs) - m(*xs)).abs().max().item()
    assert err < 1e-4, err
print("fixture ok")
'''


def _run(code: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), *triton_path(), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_helpers_match_torch():
    r = _run(HELPERS)
    assert r.returncode == 0 and "helpers ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("task,eager", [("l2_gemm_div_sum", None), ("l1_softmax_split", None),
                                        ("l1_softmax_split", "triton_poi_fused__softmax_exp_sub_4"),
                                        ("l1_softmax_split", "paired-first"), ("l1_softmax_split", "paired-last"),
                                        ("l2_gemm_div_sum", "paired-first")])
def test_a_recorded_fixture_runs_and_matches_its_reference(task, eager):
    """The lean forward (each kernel through its _Launcher) run whole: a GEMM + reduction, the
    five-kernel split softmax of KernelBench level 1 problem 23, that softmax with its last
    kernel left to eager's ATen ops (reading the buffers the split reductions wrote), and both
    with every kernel moved by one of the sweep's paired launch moves (a tile reshaped, a block
    moved with its warps)."""
    r = _run(FIXTURE, task, *([eager] if eager else []))
    assert r.returncode == 0 and "fixture ok" in r.stdout, r.stderr[-3000:]
