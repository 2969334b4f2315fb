"""The "Create a harness" skeleton is valid Python for every kind of exported launcher."""

from __future__ import annotations

import ast

import pytest

from kernel_lsp.server.harness_template import harness_for
from kernel_lsp.source import parse_document

LAUNCHERS = {
    "pointers_and_ints": 'extern "C" void scale(const float* x, float* y, float a, int n) {}\n',
    "stream": 'extern "C" void run(const float* x, float* y, int n, cudaStream_t stream) {}\n',
    "no_params": 'extern "C" void noop() {}\n',
}
KERNEL = "__global__ void k(const float* x, float* y, int n) { }\n"


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_skeleton_parses(name: str):
    doc = parse_document(f"/ws/{name}.cu", KERNEL + LAUNCHERS[name])
    text = harness_for(doc)
    tree = ast.parse(text)  # raises on the comma-inside-a-comment bug
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"Model", "get_inputs", "get_init_inputs", "kernel_forward"} <= names, text
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("lib."))
    params = LAUNCHERS[name][LAUNCHERS[name].index("(") + 1:LAUNCHERS[name].index(")")]
    assert len(call.args) == (len(params.split(",")) if params.strip() else 0), text


def test_skeleton_without_an_export_still_parses():
    text = harness_for(parse_document("/ws/k.cu", KERNEL))
    ast.parse(text)
    assert 'ENTRY = "TODO_exported_function"' in text
