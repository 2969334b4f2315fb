""""Create a harness": the Python it writes parses, for every example kernel and for C
parameter lists that are awkward in Python (unnamed, keywords, multi-line types)."""

import ast
from pathlib import Path

import pytest

from kernel_lsp.server.harness_template import harness_for
from kernel_lsp.source import parse_document, read_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("cu", sorted(EXAMPLES.glob("*.cu")), ids=lambda p: p.name)
def test_every_example_harness_parses(cu):
    text = harness_for(parse_document(str(cu), read_text(cu)))
    tree = ast.parse(text)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "lib")
    fn = parse_document(str(cu), read_text(cu))
    export = next(e for e in fn.exports if e.via == "extern_c")
    assert call.func.attr == export.name
    assert len(call.args) == len(fn.host_function(export.function or export.name).params)  # one per C parameter


def test_awkward_parameters_parse(tmp_path):
    cu = tmp_path / "odd-name.cu"
    cu.write_text(
        '#include <cuda_runtime.h>\n'
        '__global__ void k(float* y) { y[0] = 1.f; }\n'
        'extern "C" int odd_forward(const float* __restrict__ in, float *out,\n'
        '                           unsigned long long n, int lambda, int, cudaStream_t s) {\n'
        '  k<<<1, 1, 0, s>>>(out); return 0;\n}\n')
    text = harness_for(parse_document(str(cu), read_text(cu)))
    ast.parse(text)
    assert "lambda_" in text and "ENTRY = \"odd_forward\"" in text
    assert ",  # const float* __restrict__ in" in text or ",  # const float * __restrict__ in" in text
