"""kernel_lsp.source on Python files: KernelBench tasks, nn.Modules, Triton kernels, and
CUDA/C++ embedded in strings for load_inline, with exact position mapping."""

from __future__ import annotations

import ast
import dataclasses
import time
from pathlib import Path

import pytest

from kernel_lsp.model import Span, TargetKind
from kernel_lsp.source import Document, parse_document, read_text
from kernel_lsp.source.pystrings import decode_content

DATA = Path(__file__).parent / "data" / "source"
INLINE = DATA / "kernelbench_inline.py"


def _at(text: str, span: Span) -> str:
    lines = text.split("\n")
    if span.start_line == span.end_line:
        return lines[span.start_line][span.start_col:span.end_col]
    parts = [lines[span.start_line][span.start_col:]]
    parts += lines[span.start_line + 1:span.end_line]
    parts.append(lines[span.end_line][:span.end_col])
    return "\n".join(parts)


def _module_strings(text: str) -> dict[str, str]:
    """Python's own value of each `name = <string literal>` in a module."""
    values = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, str):
                values[node.targets[0].id] = value
    return values


def summary(doc: Document) -> dict:
    return {
        "targets": [t.to_dict() for t in doc.targets],
        "task": dataclasses.asdict(doc.task),
        "embedded": [(e.text, e.kind, e.span, e.call_span, e.variable, e.functions,
                      [e.to_document(i, 0) for i in range(e.text.count("\n") + 1)]) for e in doc.embedded],
        "launches": [dataclasses.asdict(x) for x in doc.launches],
        "exports": [dataclasses.asdict(x) for x in doc.exports],
        "loaded": doc.loaded_files,
        "errors": doc.syntax_errors,
        "tree": str(doc.tree.root_node) if doc.tree is not None else None,
    }


# -- the KernelBench task ----------------------------------------------------------------

def test_kernelbench_file_with_load_inline() -> None:
    text = read_text(INLINE)
    doc = parse_document(str(INLINE), text)
    assert doc.language == "python" and doc.syntax_errors == []
    task = doc.task
    assert (task.has_model, task.has_model_new, task.has_get_inputs, task.has_get_init_inputs) == (True,) * 4
    assert task.is_reference and task.is_candidate
    assert _at(text, task.spans["get_inputs"]).startswith("def get_inputs():")
    kinds = [(t.kind, t.name) for t in doc.targets]
    assert kinds == [
        (TargetKind.EMBEDDED_CUDA, "cuda_source"),
        (TargetKind.CUDA_KERNEL, "scale_relu_kernel"),
        (TargetKind.HOST_EXPORT, "scale_relu"),
        (TargetKind.TASK_MODEL, "Model"),
        (TargetKind.CANDIDATE_MODEL, "ModelNew"),
    ]
    model = doc.target("Model")
    assert model.data["init_params"] == ["alpha: float"] and model.data["forward_params"] == ["x"]
    assert doc.target("ModelNew").data["init_params"] == ["alpha: float"]
    assert _at(text, model.name_span) == "Model"


def test_embedded_sources_have_python_values() -> None:
    text = read_text(INLINE)
    doc = parse_document(str(INLINE), text)
    python_values = _module_strings(text)
    by_kind = {e.kind: e for e in doc.embedded}
    assert set(by_kind) == {"cuda", "cpp"}
    cuda, cpp = by_kind["cuda"], by_kind["cpp"]
    assert cuda.text == python_values["cuda_source"]
    assert cpp.text == python_values["cpp_source"]
    assert (cuda.variable, cuda.module_name, cuda.functions) == ("cuda_source", "scale_relu", ["scale_relu"])
    assert _at(text, cuda.span) == cuda.text  # a raw string: the content is the value
    assert _at(text, cuda.call_span).startswith("load_inline(\n    name=\"scale_relu\"")


def test_mapping_a_line_inside_the_string_to_the_file_exactly() -> None:
    text = read_text(INLINE)
    doc = parse_document(str(INLINE), text)
    cuda = next(e for e in doc.embedded if e.kind == "cuda")
    file_lines = text.split("\n")
    # The content starts right after r""" on line 5 (0-based): string line 0 is empty there.
    assert file_lines[5] == 'cuda_source = r"""'
    assert cuda.to_document(0, 0) == (5, 18)
    assert cuda.text.split("\n")[1] == "#include <torch/extension.h>"
    assert cuda.to_document(1, 0) == (6, 0)
    kernel_line = cuda.text.split("\n").index(
        "__global__ void scale_relu_kernel(const float* __restrict__ x, float* __restrict__ y,")
    assert cuda.to_document(kernel_line, 16) == (11, 16)
    assert file_lines[11][16:33] == "scale_relu_kernel"
    # Every line of the value sits at the mapped place in the file.
    for i, line in enumerate(cuda.text.split("\n")):
        row, col = cuda.to_document(i, 0)
        assert file_lines[row][col:col + len(line)] == line
    # And back.
    assert cuda.from_document(11, 16) == (kernel_line, 16)
    assert cuda.from_document(3, 0) is None


def test_embedded_kernels_are_targets_in_the_python_file() -> None:
    text = read_text(INLINE)
    doc = parse_document(str(INLINE), text)
    kernel = doc.target("scale_relu_kernel")
    assert kernel.kind is TargetKind.CUDA_KERNEL and kernel.path == str(INLINE)
    embedded_index = next(i for i, e in enumerate(doc.embedded) if e.kind == "cuda")
    assert kernel.data["embedded"] == embedded_index
    assert _at(text, kernel.name_span) == "scale_relu_kernel"
    assert kernel.span.start_line == 11 and _at(text, kernel.span).endswith("    }\n}")
    assert kernel.data["params"][2] == {"type": "float", "name": "alpha"}
    (launch,) = doc.launches
    assert launch.embedded == embedded_index and launch.function == "scale_relu"
    assert _at(text, launch.config_span) == "<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>"
    (define,) = doc.defines
    assert (define.name, define.int_value) == ("BLOCK", 256) and _at(text, define.value_span) == "256"
    (export,) = doc.exports
    assert (export.name, export.via, export.library) == ("scale_relu", "load_inline", "scale_relu")
    assert _at(text, export.name_span) == "scale_relu"
    wrapper = doc.target("cuda_source")
    assert wrapper.data["kernels"] == ["scale_relu_kernel"] and wrapper.span == doc.embedded[embedded_index].span
    # The innermost target under the cursor inside the kernel is the kernel, not the string.
    assert doc.target_at(13, 8).name == "scale_relu_kernel"
    assert doc.target_at(8, 0).kind is TargetKind.EMBEDDED_CUDA
    assert doc.embedded_at(8, 0) is doc.embedded[embedded_index]


ESCAPED = '''from torch.utils.cpp_extension import load_inline
src = """
#include <cstdio>
__global__ void tab_kernel(int* p) {\\tp[0] = 1; printf("done\\\\n"); }  /* \\x41 \\u00e9 */
__global__ void after_newline(int* p) {}\\n__global__ void same_file_line(int* p) {}
"""
mod = load_inline("m", "", cuda_sources=src)
'''


def test_escapes_map_exactly_even_when_they_make_lines() -> None:
    doc = parse_document("esc.py", ESCAPED)
    (emb,) = doc.embedded  # cpp_sources="" holds no code: no EmbeddedSource for it
    assert emb.text == _module_strings(ESCAPED)["src"]
    assert "\tp[0]" in emb.text and 'printf("done\\n")' in emb.text and "A é" in emb.text
    names = [t.name for t in doc.kernels]
    assert names == ["tab_kernel", "after_newline", "same_file_line"]
    # `\n` in the Python source is a line break in the CUDA text, on the same file line.
    value_lines = emb.text.split("\n")
    same = value_lines.index("__global__ void same_file_line(int* p) {}")
    row, col = emb.to_document(same, 0)
    file_line = ESCAPED.split("\n")[row]
    assert file_line[col:].startswith("__global__ void same_file_line")
    assert file_line[:col].endswith("{}\\n")
    for kernel in doc.kernels:
        assert _at(ESCAPED, kernel.name_span) == kernel.name
    # A position after an escape on one line maps past the escape's source characters.
    tab_line = value_lines.index(next(v for v in value_lines if v.startswith("__global__ void tab_kernel")))
    col_in_value = value_lines[tab_line].index("p[0] = 1")
    row, col = emb.to_document(tab_line, col_in_value)
    assert ESCAPED.split("\n")[row][col:].startswith("p[0] = 1")


CONCAT = '''import torch.utils.cpp_extension as ext
HEADER = "#include <cuda_runtime.h>\\n"
BODY = ("__global__ void a_kernel(float* x) { x[0] = 1.f; }\\n"
        'extern "C" void launch_a(float* x) { a_kernel<<<1, 1>>>(x); }\\n')
cpp = "void launch_a(float* x);"
m1 = ext.load_inline(name="m1", cpp_sources=[cpp], cuda_sources=[HEADER + BODY], functions=["launch_a"])
m2 = ext.load_inline(name="m2", cpp_sources="", cuda_sources=[r"__global__ void b_kernel() {}", BODY])
m3 = ext.load(name="m3", sources=["kernels/a.cu", os.path.join(HERE, "b.cu")], verbose=True)
other = torch.load("weights.pt")
'''


def test_concatenations_lists_and_names() -> None:
    doc = parse_document("concat.py", CONCAT)
    values = _module_strings(CONCAT)
    cuda = [e for e in doc.embedded if e.kind == "cuda"]
    assert [e.text for e in cuda] == [values["HEADER"] + values["BODY"],
                                      "__global__ void b_kernel() {}", values["BODY"]]
    assert [e.module_name for e in cuda] == ["m1", "m2", "m2"]
    assert cuda[2].variable == "BODY" and cuda[1].variable is None
    assert [t.name for t in doc.kernels] == ["a_kernel", "a_kernel", "b_kernel"]  # document order
    for kernel in doc.kernels:
        assert _at(CONCAT, kernel.name_span) == kernel.name
    # Line 1 of HEADER + BODY starts BODY's first piece, after `BODY = ("` on file line 2.
    assert cuda[0].to_document(0, 0) == (1, 10)
    assert cuda[0].to_document(1, 0) == (2, 9)
    # Line 1 of BODY's value is its second literal, on the next file line.
    assert cuda[2].to_document(1, 0) == (3, 9)
    assert doc.loaded_files == ["kernels/a.cu", "b.cu"]
    exports = [(e.name, e.via) for e in doc.exports]
    assert ("launch_a", "extern_c") in exports and ("launch_a", "load_inline") in exports


# -- modules and triton ------------------------------------------------------------------

TRITON = '''import torch
import triton
import triton.language as tl
from torch import nn
from torch.nn import Module


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], key=["n"])
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs), mask=offs < n)


@triton.jit(do_not_specialize=["n"])
def scale_kernel(x_ptr, n, SCALE: tl.constexpr = 2):
    pass


@torch.no_grad()
def not_a_kernel(x):
    return x


class Block(Module):
    def forward(self, x):
        return x


class Deeper(Block):
    pass


class Plain:
    pass


def factory():
    class Model(torch.nn.Module):
        pass
    return Model
'''


def test_triton_kernels_and_modules() -> None:
    doc = parse_document("tri.py", TRITON)
    got = [(t.kind, t.name) for t in doc.targets]
    assert got == [
        (TargetKind.TRITON_KERNEL, "add_kernel"),
        (TargetKind.TRITON_KERNEL, "scale_kernel"),
        (TargetKind.NN_MODULE, "Block"),
        (TargetKind.NN_MODULE, "Deeper"),
        (TargetKind.NN_MODULE, "Model"),  # inside a function: a module, not the task's Model
    ]
    add = doc.targets[0]
    assert add.data["autotune"] is True and add.data["constexpr_params"] == ["BLOCK"]
    assert add.data["params"] == ["x_ptr", "y_ptr", "out_ptr", "n", "BLOCK: tl.constexpr"]
    assert add.span.start_line == 7 and _at(TRITON, add.name_span) == "add_kernel"
    scale = doc.targets[1]
    assert scale.data["autotune"] is False and scale.data["constexpr_params"] == ["SCALE"]
    assert not doc.task.has_model
    assert doc.target_at(11, 4).name == "add_kernel"


# -- positions and bad input -------------------------------------------------------------

def test_non_ascii_columns_in_python_and_embedded_cuda() -> None:
    text = ('s = "é"; cuda = """/* ∑ — ü */ __global__ void k_é(float* x) {}"""\n'
            'mod = load_inline(name="m", cpp_sources="", cuda_sources=cuda)\n'
            "class ModèleNew(nn.Module): pass\n")
    doc = parse_document("u.py", text)
    (kernel,) = doc.kernels
    assert _at(text, kernel.name_span) == "k_é"
    assert kernel.name_span.start_col == text.split("\n")[0].index("k_é")
    module = doc.target("ModèleNew")
    assert module.kind is TargetKind.NN_MODULE and _at(text, module.name_span) == "ModèleNew"


def test_broken_python_still_yields_targets() -> None:
    text = read_text(INLINE).replace("    def forward(self, x):\n        return torch.relu",
                                     "    def forward(self, x:\n        return torch.relu", 1)
    doc = parse_document("broken.py", text)
    assert doc.syntax_errors
    names = {t.name for t in doc.targets}
    assert {"scale_relu_kernel", "ModelNew"} <= names
    assert doc.task.has_get_inputs and doc.task.has_get_init_inputs and doc.task.has_model_new
    # tree-sitter folded ModelNew into the broken Model; it is read back from the text.
    model_new = doc.target("ModelNew")
    assert model_new.data.get("recovered") is True and model_new.kind is TargetKind.CANDIDATE_MODEL
    assert _at(text, model_new.name_span) == "ModelNew"
    assert _at(text, model_new.span).endswith("return scale_relu.scale_relu(x, self.alpha)")


def test_odd_python_never_raises() -> None:
    for text in ["", "load_inline(", "load_inline(cuda_sources=)", "load_inline(cuda_sources=undefined)",
                 'load_inline("m", cuda_sources=f"{x}")', "class (nn.Module", "@triton.jit\n",
                 '"""unterminated', "x = '''\\", "\0", "\ud800", "load(sources=[1, None])",
                 "a = a\nload_inline('m', a, a)", 'cuda_sources = b"bytes"\nload_inline("m", "", cuda_sources)']:
        doc = parse_document("odd.py", text)
        assert doc.text == text and isinstance(doc.targets, list)


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:invalid escape sequence:SyntaxWarning")
@pytest.mark.parametrize("literal", [
    r'"plain"', r"'a\tb\\c\'d'", r'"\x41\101\u00e9\N{GREEK SMALL LETTER ALPHA}\q"',
    r'r"raw\n\"kept"', '"""a\\\nb"""', '"""line\r\nnext"""', r'f"{{braces}}"', r'"\U0001F642 end"',
])
def test_decode_content_matches_python(literal: str) -> None:
    prefix_end = min(i for i in (literal.find('"'), literal.find("'")) if i >= 0)
    prefix = literal[:prefix_end]
    quote = '"""' if literal[prefix_end:].startswith('"""') else literal[prefix_end]
    content = literal[prefix_end + len(quote):-len(quote)]
    value, offsets = decode_content(content, prefix)
    # Python reads source files with universal newlines: "\r\n" in a file is "\n" in the value.
    assert value == eval(literal.replace("\r\n", "\n"))  # noqa: S307 - our own literals
    assert len(offsets) == len(value) + 1 and offsets[-1] == len(content)
    assert offsets == sorted(offsets)


# -- incremental and size ----------------------------------------------------------------

def test_incremental_reparse_matches_a_fresh_parse() -> None:
    path = str(INLINE)
    doc = parse_document(path, read_text(INLINE))
    edits = [
        lambda t: t.replace("float v = alpha * x[i];", "float v = alpha * x[i] + 0.f; // ü"),
        lambda t: t.replace("class ModelNew", "class ModelNewer"),
        lambda t: t.replace('cuda_source = r"""', 'cuda_source = """'),
        lambda t: t.replace("def get_inputs():", "def get_inputs(:"),
        lambda t: t.replace("def get_inputs(:", "def get_inputs():"),
        lambda t: "# é\n" + t,
        lambda t: t[: len(t) // 2],
        lambda t: read_text(INLINE),
    ]
    for i, edit in enumerate(edits):
        new_text = edit(doc.text)
        before = summary(doc)
        incremental = parse_document(path, new_text, old=doc)
        assert summary(incremental) == summary(parse_document(path, new_text)), f"edit {i}"
        assert summary(doc) == before
        doc = incremental
    assert doc.task.is_reference and doc.task.is_candidate


def test_twenty_thousand_python_lines_parse_fast() -> None:
    block = read_text(INLINE)
    copies = 20_000 // block.count("\n") + 1
    text = "\n".join(block.replace("Model", f"Model{i}").replace("scale_relu", f"scale_relu{i}")
                     .replace("cuda_source =", f"cuda_source{i} =")
                     .replace("cuda_sources=cuda_source,", f"cuda_sources=cuda_source{i},")
                     for i in range(copies))
    assert text.count("\n") >= 20_000
    started = time.perf_counter()
    doc = parse_document("big.py", text)
    fresh = time.perf_counter() - started
    assert len(doc.embedded) == 2 * copies
    assert len(doc.targets) == 5 * copies
    # Measured on a quiet 2-core machine: see the report; the bound is generous for CI.
    assert fresh < 5.0, f"fresh parse of 20,000 lines took {fresh:.2f} s"
