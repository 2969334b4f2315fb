"""The table binding (worker/build/table_binding.py): one main.cpp for every signature of its types.

What is read (the codes, the refusals), the mangled names against g++'s own, and then, with the
real nvcc and g++ against this CPU torch (conftest's cpu_link, over the session's pch_cache), that
one file of ten functions covering every type (arguments on the stack included) behaves as the
binding by signature does, call by call and refusal by refusal; that a second file of other
signatures compiles no main.cpp; and that a declaration the code does not define falls back to
load_inline's text."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap

import pytest

from kernel_lsp.engine.worker.build import binding, fastbuild, table_binding
from tests.engine.conftest import NVCC, run_in_extension
from tests.needs import needs_nvcc


def codes(cpp: str, functions) -> tuple[list[tuple[str, str]], str]:
    b, why = binding.of({"cpp_sources": cpp, "functions": functions})
    assert b is not None, why
    return table_binding.codes_of(b)


def test_declarations_become_codes_and_the_rest_is_refused() -> None:
    assert codes("torch::Tensor f(torch::Tensor x, const torch::Tensor& y, float a, double b, int64_t k, bool n, "
                 "const int c);", ["f"]) == ([("T", "TRfdlbi")], "")
    assert codes("std::vector<at::Tensor> g(at::Tensor const& x);\nvoid h();", ["g", "h"]) == (
        [("V", "R"), ("v", "")], "")
    assert codes("torch::Tensor f(torch::Tensor& x);", ["f"]) == ([], "f: the table binding has no 'torch::Tensor&'")
    assert codes("std::tuple<torch::Tensor, torch::Tensor> f(torch::Tensor x);", ["f"])[1].startswith(
        "f: the table binding has no 'std::tuple")
    seventeen = ", ".join(["int"] * 17)
    assert codes(f"int f({seventeen});", ["f"]) == ([], "f: more arguments than the table binding passes")
    seventeen_mixed = ", ".join(["int"] * 9 + ["float"] * 8)  # slots enough, but MAIN defines up to 16
    assert codes(f"int f({seventeen_mixed});", ["f"]) == ([], "f: more arguments than the table binding passes")
    nine = ", ".join(["float"] * 9)
    assert codes(f"int f({nine});", ["f"]) == ([], "f: more arguments than the table binding passes")
    # sixteen integer-class slots count the hidden return pointer: 15 tensors and a tensor back fit
    fifteen = ", ".join(["torch::Tensor"] * 15)
    assert codes(f"torch::Tensor f({fifteen});", ["f"])[0] == [("T", "T" * 15)]
    assert codes(f"torch::Tensor f({fifteen}, int);", ["f"])[0] == []


def test_the_mangled_names_are_g_plus_plus_s(tmp_path) -> None:
    # The same names g++ gives these declarations (at::Tensor: a class of the same name; the ABI
    # mangles names, not layouts), substitutions past S9_ included.
    ctype = {"T": "at::Tensor", "R": "const at::Tensor&", "f": "float", "d": "double", "i": "int",
             "l": "int64_t", "b": "bool"}
    rng = random.Random(7)
    combos = ["", "T", "R", "TR", "RT", "RR", "TRTR", "R" * 14]
    combos += ["".join(rng.choice("TRfdilb") for _ in range(rng.randint(1, 9))) for _ in range(120)]
    src = ["#include <cstdint>", "namespace at { class Tensor { public: Tensor(const Tensor&); ~Tensor(); }; }"]
    src += [f"void fn{k}({', '.join(ctype[c] for c in combo)}) {{}}" for k, combo in enumerate(combos)]
    (tmp_path / "m.cpp").write_text("\n".join(src))
    subprocess.run(["g++", "-c", "m.cpp", "-o", "m.o"], cwd=tmp_path, check=True)
    defined = set(subprocess.run(["nm", "--defined-only", "m.o"], cwd=tmp_path, capture_output=True, text=True,
                                 check=True).stdout.split())
    wrong = [c for k, c in enumerate(combos) if table_binding.mangled(f"fn{k}", c) not in defined]
    assert wrong == []


def test_the_table_names_each_function_by_its_mangled_name() -> None:
    b, _ = binding.of({"cpp_sources": "torch::Tensor scale(torch::Tensor x, double s);",
                       "functions": {"scale": "x times s"}, "with_pytorch_error_handling": False})
    text = table_binding.table_c(b, table_binding.codes_of(b)[0])
    assert 'extern void _Z5scaleN2at6TensorEd(void);' in text
    assert '{"scale", "x times s", (void *)&_Z5scaleN2at6TensorEd, "T", "Td", 0},' in text


# -- real builds --------------------------------------------------------------------------------

CUDA = r'''
#include <torch/extension.h>
#include <vector>
__global__ void unused_kernel(float* x) { x[threadIdx.x] = 0.f; }
torch::Tensor axpy(torch::Tensor x, const torch::Tensor& y, double a, float b, int64_t k, bool neg, int i) {
    auto r = x * a + y * (double)b + (double)(k * 100 + i);
    return neg ? -r : r;
}
std::vector<torch::Tensor> split2(const torch::Tensor& x) { return {x + 1, x - 1}; }
void fill(torch::Tensor x, float v) { x.fill_(v); }
double dsum(torch::Tensor x) { return x.sum().item<double>(); }
float halve(float v) { return v / 2; }
int64_t many(torch::Tensor a, torch::Tensor b, torch::Tensor c, torch::Tensor d, torch::Tensor e, int i1, int i2,
             int i3, int i4, int i5, int i6, int i7, int i8, int i9, int i10, float f) {
    return a.numel() + 10 * b.numel() + 100 * c.numel() + 1000 * d.numel() + 10000 * e.numel()
        + (int64_t)i1 * 1 + i2 * 2 + i3 * 3 + i4 * 4 + i5 * 5 + i6 * 6 + i7 * 7 + i8 * 8 + i9 * 9 + i10 * 10
        + (int64_t)(f * 1000);
}
bool check(torch::Tensor x) { TORCH_CHECK(x.dim() == 1, "x must be 1-D, got ", x.dim()); return true; }
int twice(const int k) { return 2 * k; }
torch::Tensor keep(torch::Tensor x) { return x; }
void nothing() {}
'''
DECLS = """torch::Tensor axpy(torch::Tensor x, const torch::Tensor& y, double a, float b, int64_t k, bool neg, int i);
std::vector<torch::Tensor> split2(const torch::Tensor& x);
void fill(torch::Tensor x, float v);
double dsum(torch::Tensor x);
float halve(float v);
int64_t many(torch::Tensor a, torch::Tensor b, torch::Tensor c, torch::Tensor d, torch::Tensor e, int i1, int i2,
             int i3, int i4, int i5, int i6, int i7, int i8, int i9, int i10, float f);
bool check(torch::Tensor x);
int twice(const int k);
torch::Tensor keep(torch::Tensor x);
void nothing();"""
FUNCTIONS = {"axpy": "x * a + y * b + k * 100 + i", "split2": "x + 1, x - 1", "fill": "fill x with v",
             "dsum": "sum", "halve": "v / 2", "many": "numels and ints", "check": "1-D or not",
             "twice": "2 k", "keep": "x itself", "nothing": "nothing"}

# Every call and refusal, printed: the two bindings must print the same lines.
CALLS = textwrap.dedent(r"""
    import gc, importlib.machinery, importlib.util, sys, weakref, torch
    name, so = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, so))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    x, y = torch.arange(4.0), torch.ones(4)
    def show(label, thunk):
        try:
            got = thunk()
        except Exception as e:
            got = f"{type(e).__name__}: " + str(e).replace(name, "<name>").splitlines()[0]
        if isinstance(got, torch.Tensor):
            got = ("tensor", got.tolist())
        elif isinstance(got, list):
            got = [t.tolist() if isinstance(t, torch.Tensor) else t for t in got]
        print(f"{label}\t{got!r}")
    show("axpy", lambda: m.axpy(x, y, 2.0, 0.5, 3, False, 7))
    show("axpy neg, int for float", lambda: m.axpy(x, y, 2, 1, 3, True, -7))
    show("axpy str for float", lambda: m.axpy(x, y, "2", 0.5, 3, False, 7))
    show("axpy float for int", lambda: m.axpy(x, y, 2.0, 0.5, 3.5, False, 7))
    show("axpy one short", lambda: m.axpy(x, y, 2.0, 0.5, 3, False))
    show("axpy keyword", lambda: m.axpy(x, y, 2.0, 0.5, 3, False, i=7))
    show("axpy list for tensor", lambda: m.axpy([1.0], y, 2.0, 0.5, 3, False, 7))
    show("split2", lambda: m.split2(x))
    z = torch.zeros(3); m.fill(z, 1.25); show("fill", lambda: z.tolist())
    show("fill returns", lambda: m.fill(z, 2.5))
    show("dsum", lambda: m.dsum(x))
    show("halve", lambda: m.halve(3.0))
    show("halve big int", lambda: m.halve(2 ** 24 + 1))
    show("many", lambda: m.many(x, y, x[:1], torch.ones(2, 3), torch.ones(5), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0.125))
    show("many negative ints", lambda: m.many(x, x, x, x, x, -2 ** 31, -2, -3, -4, -5, -6, -7, -8, -9, -10, -0.5))
    show("check", lambda: m.check(x))
    show("check 2-D", lambda: m.check(torch.ones(2, 2)))
    show("twice", lambda: m.twice(-21))
    show("twice overflow", lambda: m.twice(2 ** 40))
    show("keep is x", lambda: m.keep(x) is x)
    show("nothing", lambda: m.nothing())
    for f in FUNCTIONS:
        print(f"doc {f}\t{getattr(m, f).__doc__.strip().splitlines()[-1]}")
    # no reference kept: a tensor passed by value, by reference and returned is freed after
    w = torch.ones(8); ref = weakref.ref(w)
    for _ in range(1000):
        m.axpy(w, w, 1.0, 1.0, 0, False, 0); m.keep(w); m.split2(w); m.dsum(w)
    del w; gc.collect()
    print(f"freed\t{ref() is None}")
""").replace("FUNCTIONS", repr(list(FUNCTIONS)))


def build(tmp_path, name: str, cpp: str = DECLS, cuda: str = CUDA, functions=None, **kw) -> fastbuild.FastBuild:
    args = {"name": name, "cpp_sources": cpp, "cuda_sources": cuda, "functions": functions or FUNCTIONS,
            "build_directory": str(tmp_path / name), "extra_cuda_cflags": ["-O3"], **kw}
    return fastbuild.build_inline(args, NVCC)


def run_calls(env, name: str, so: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CALLS, name, so], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@needs_nvcc
@pytest.mark.slow
def test_one_main_cpp_calls_every_type_as_the_binding_by_signature_does(cpu_link, monkeypatch) -> None:
    tmp_path, env = cpu_link
    fb = build(tmp_path, "klsp_table_a")
    assert fb.reason == "" and fb.so and fb.binding == "by table", fb.log[-3000:]
    assert "main" in fb.compiled
    exported = subprocess.run(["nm", "-D", fb.so], capture_output=True, text=True).stdout
    assert not re.search(r"\bklsp_table(_len)?\b", exported)  # the table stays inside the extension
    by_table = run_calls(env, "klsp_table_a", fb.so)
    monkeypatch.setenv(table_binding.OFF_ENV, "0")
    fs = build(tmp_path, "klsp_table_sig")
    assert fs.reason == "" and fs.binding == "by signature", fs.log[-3000:]
    by_signature = run_calls(env, "klsp_table_sig", fs.so)
    # The values, the conversions pybind allows or refuses, torch's errors, the docstrings and no
    # leak: the same, line by line.
    assert by_table == by_signature
    got = dict(line.split("\t", 1) for line in by_table)
    expected = {
        "axpy": "('tensor', [307.5, 309.5, 311.5, 313.5])",
        "axpy neg, int for float": "('tensor', [-294.0, -296.0, -298.0, -300.0])",
        "split2": "[[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 1.0, 2.0]]",
        "fill": "[1.25, 1.25, 1.25]", "fill returns": "None", "dsum": "6.0", "halve": "1.5",
        "halve big int": "8388608.0",
        "many": f"{4 + 10 * 4 + 100 * 1 + 1000 * 6 + 10000 * 5 + 385 + 125}",
        "many negative ints": f"{44444 - 2 ** 31 - 384 - 500}",
        "check": "True", "check 2-D": "'RuntimeError: x must be 1-D, got 2'", "twice": "-42", "keep is x": "True",
        "nothing": "None", "doc axpy": FUNCTIONS["axpy"], "doc nothing": "nothing", "freed": "True",
    }
    assert {k: got.get(k) for k in expected} == expected
    # str and float where a number and an int go, one short, a keyword, a list, 2**40 for an int
    refused = [k for k, v in got.items() if "TypeError: " in v and "incompatible function arguments" in v]
    assert refused == ["axpy str for float", "axpy float for int", "axpy one short", "axpy keyword",
                       "axpy list for tensor", "twice overflow"]


@needs_nvcc
@pytest.mark.slow
def test_a_second_file_of_other_signatures_compiles_no_main_cpp(cpu_link) -> None:
    tmp_path, env = cpu_link
    got = fastbuild.prebuild_bindings(fastbuild.torch_flags(NVCC), len(binding.COMMON))
    assert list(got) == [fastbuild.TABLE_KEY] and isinstance(got[fastbuild.TABLE_KEY], float)  # one object, not 8
    kept = json.loads((fastbuild.cache_root() / "prebuild" / fastbuild.PREBUILT).read_text())
    assert kept["signatures"] == got
    cuda = CUDA + "torch::Tensor layer(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) " \
                  "{ return (x - x.mean()) / (x.var(false) + eps).sqrt() * w + b; }\n"
    fb = build(tmp_path, "klsp_table_b", cpp="torch::Tensor layer(torch::Tensor x, torch::Tensor w, torch::Tensor b, "
               "double eps);\nint twice(int k);", cuda=cuda, functions=["layer", "twice"],
               with_pytorch_error_handling=False)
    assert fb.reason == "" and fb.binding == "by table", fb.log[-3000:]
    assert "main" in fb.reused and "main" not in fb.compiled
    out = run_in_extension(env, "klsp_table_b", fb.so, "x = torch.tensor([1.0, 3.0])\nprint(m.layer(x, torch.full("
                           "(2,), 2.0), torch.ones(2), 0.0).tolist(), m.twice(4), m.layer.__doc__.split()[-1])\n")
    assert out.split() == ["[-1.0,", "3.0]", "8", "layer"]


@needs_nvcc
@pytest.mark.slow
def test_a_declaration_the_code_does_not_define_falls_back_to_load_inline_s_text(cpu_link) -> None:
    tmp_path, _ = cpu_link
    fb = build(tmp_path, "klsp_table_wrong", cpp="int twice(long k);", functions=["twice"])
    assert fb.binding.startswith("load_inline's text: the table binding failed (the table binding: undefined "
                                 "reference to _Z5twicel (int twice(long))"), fb.binding
    assert 'm.def("twice", torch::wrap_pybind_function(twice), "twice");' in (
        tmp_path / "klsp_table_wrong" / "fast_main.cpp").read_text()
    assert "main" in fb.compiled and fb.reason == ""  # links (a shared object may leave it undefined)


@needs_nvcc
@pytest.mark.slow
def test_a_table_main_cpp_that_does_not_build_here_leaves_the_binding_by_signature(cpu_link, monkeypatch) -> None:
    # A torch whose headers the table's main.cpp does not build against: not the user's error,
    # so the build goes on by signature (not with load_inline's text, which costs a compile more).
    tmp_path, env = cpu_link
    monkeypatch.setattr(table_binding, "MAIN", "#error this torch has no table binding\n" + table_binding.MAIN)
    fb = build(tmp_path, "klsp_table_broken", cpp="int twice(const int k);", functions=["twice"])
    assert fb.reason == "", fb.log[-3000:]
    assert fb.binding.startswith("by signature (after the table binding failed (fast main unit failed to compile"), \
        fb.binding
    assert "this torch has no table binding" in fb.binding and fb.steps["binding_attempt"] > 0
    assert run_in_extension(env, "klsp_table_broken", fb.so, "print(m.twice(21))\n").split() == ["42"]
