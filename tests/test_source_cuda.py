"""kernel_lsp.source on CUDA files: kernels, launches, exports, macros, constants, spans."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from kernel_lsp.model import Span, TargetKind
from kernel_lsp.source import Document, SourceError, parse_document, read_text

DATA = Path(__file__).parent / "data" / "source"


def _doc(name: str) -> Document:
    return parse_document(str(DATA / name), read_text(DATA / name))


def _at(text: str, span: Span) -> str:
    """The text a span covers (code-point columns)."""
    lines = text.split("\n")
    if span.start_line == span.end_line:
        return lines[span.start_line][span.start_col:span.end_col]
    parts = [lines[span.start_line][span.start_col:]]
    parts += lines[span.start_line + 1:span.end_line]
    parts.append(lines[span.end_line][:span.end_col])
    return "\n".join(parts)


def summary(doc: Document) -> dict:
    """Everything a reader of a Document sees, as plain data (to compare two parses)."""
    return {
        "targets": [t.to_dict() for t in doc.targets],
        "launches": [dataclasses.asdict(x) for x in doc.launches],
        "exports": [dataclasses.asdict(x) for x in doc.exports],
        "defines": [dataclasses.asdict(x) for x in doc.defines],
        "constants": [dataclasses.asdict(x) for x in doc.constants],
        "errors": doc.syntax_errors,
        "tree": str(doc.tree.root_node) if doc.tree is not None else None,
    }


# -- kernels -----------------------------------------------------------------------------

def test_softmax_kernels_with_templates_and_launch_bounds() -> None:
    doc = _doc("softmax.cu")
    assert doc.language == "cuda"
    assert doc.syntax_errors == []
    assert [k.name for k in doc.kernels] == ["softmax_kernel", "fill_kernel"]
    soft = doc.kernels[0]
    assert soft.kind is TargetKind.CUDA_KERNEL
    assert soft.data["template_params"] == [
        {"name": "scalar_t", "kind": "type", "type": None, "default": None},
        {"name": "THREADS", "kind": "value", "type": "int", "default": "BLOCK_THREADS"},
    ]
    assert soft.data["launch_bounds"] == ["THREADS", "2"]
    # THREADS defaults to BLOCK_THREADS, which is (8 * WARP_SIZE): the tuner and occupancy see 256.
    assert soft.data["launch_bounds_values"] == [256, 2]
    assert soft.data["params"] == [
        {"type": "const scalar_t* __restrict__", "name": "input"},
        {"type": "scalar_t* __restrict__", "name": "output"},
        {"type": "int", "name": "rows"},
        {"type": "int", "name": "cols"},
    ]
    # The span covers the template header through the closing brace; the name span the identifier.
    assert soft.span.start_line == 26 and doc.text.split("\n")[26].startswith("template <typename scalar_t")
    assert _at(doc.text, soft.span).endswith("/ s);\n}")
    assert _at(doc.text, soft.name_span) == "softmax_kernel"
    assert soft.detail.startswith("template <typename scalar_t, int THREADS = BLOCK_THREADS> __global__ void")
    assert soft.detail.endswith("softmax_kernel(const scalar_t* __restrict__ input, "
                                "scalar_t* __restrict__ output, int rows, int cols)")
    fill = doc.kernels[1]
    assert fill.data["qualified_name"] == "detail::fill_kernel"
    assert _at(doc.text, fill.name_span) == "fill_kernel"


def test_device_functions_and_prototypes_are_not_targets() -> None:
    doc = _doc("softmax.cu")
    names = {t.name for t in doc.targets}
    assert "warp_max" not in names and "warp_sum" not in names
    doc = parse_document("p.cu", "__global__ void proto(int);\n__device__ int f() { return 1; }\n")
    assert doc.targets == []


def test_launch_sites_with_template_arguments_and_config() -> None:
    doc = _doc("softmax.cu")
    first, second, third = doc.launches
    assert first.kernel == "softmax_kernel"
    assert first.name == "softmax_kernel<float, BLOCK_THREADS>"
    assert first.template_args == ["float", "BLOCK_THREADS"]
    assert (first.grid, first.block, first.shared_mem, first.stream) == ("rows", "BLOCK_THREADS", "0", "stream")
    assert first.args == ["x.data_ptr<float>()", "y.data_ptr<float>()", "rows", "cols"]
    assert first.function == "softmax_forward"
    assert _at(doc.text, first.name_span) == "softmax_kernel<float, BLOCK_THREADS>"
    assert _at(doc.text, first.config_span) == "<<<rows, BLOCK_THREADS, 0, stream>>>"
    assert first.span.end_line == first.span.start_line + 1  # the call continues on the next line
    assert second.name == "softmax_kernel<float>" and second.function == "softmax_launch"
    assert [x.block_threads for x in doc.launches] == [256, 256, 256]
    assert third.kernel == "detail::fill_kernel"
    assert (third.grid, third.block, third.shared_mem, third.stream) == ("CEIL_DIV(n, 256)", "256", None, None)


def test_launch_of_explicit_template_kernel() -> None:
    text = ("template <typename T, int B> __global__ void k(T* x) {}\n"
            "void go(float* x, cudaStream_t s) { k<float, 256><<<dim3(4, 2), dim3(256), 1024, s>>>(x); }\n")
    doc = parse_document("t.cu", text)
    (launch,) = doc.launches
    assert (launch.kernel, launch.name, launch.template_args) == ("k", "k<float, 256>", ["float", "256"])
    assert (launch.grid, launch.block, launch.shared_mem, launch.stream) == ("dim3(4, 2)", "dim3(256)", "1024", "s")
    assert launch.block_threads == 256
    other = parse_document("d.cu", "#define W 32\n__global__ void k() {}\nvoid f(int n) { k<<<1, dim3(W, 4)>>>(); "
                                   "k<<<1, n>>>(); }\n")
    assert [x.block_threads for x in other.launches] == [128, None]
    assert doc.kernels[0].data["template_params"][1] == {"name": "B", "kind": "value", "type": "int",
                                                         "default": None}


# -- exports -----------------------------------------------------------------------------

def test_pybind_and_extern_c_exports() -> None:
    doc = _doc("softmax.cu")
    exports = {(e.name, e.via): e for e in doc.exports}
    assert set(exports) == {("softmax_forward", "pybind11"), ("softmax_launch", "extern_c"),
                            ("kernel_count", "extern_c"), ("fill_launch", "extern_c")}
    py = exports[("softmax_forward", "pybind11")]
    assert py.function == "softmax_forward"
    assert _at(doc.text, py.name_span) == "softmax_forward"
    assert _at(doc.text, py.span).startswith('m.def("softmax_forward"')
    # fill_launch is declared inside extern "C" { } and defined later: the definition is the span.
    fill = exports[("fill_launch", "extern_c")]
    assert doc.text.split("\n")[fill.span.start_line] == "void fill_launch(float* p, float v, int n) {"
    host = {t.name: t for t in doc.targets if t.kind is TargetKind.HOST_EXPORT}
    assert set(host) == {"softmax_forward", "softmax_launch", "kernel_count", "fill_launch"}
    forward = host["softmax_forward"]
    assert forward.detail == "torch::Tensor softmax_forward(torch::Tensor x)"
    assert forward.data["via"] == "pybind11" and forward.data["params"] == [{"type": "torch::Tensor", "name": "x"}]
    assert _at(doc.text, forward.name_span) == "softmax_forward"
    assert host["softmax_launch"].data["params"][-1] == {"type": "cudaStream_t", "name": "stream"}


def test_extern_c_declaration_without_definition_is_not_an_export() -> None:
    doc = parse_document("x.cu", 'extern "C" { void from_elsewhere(int); }\nextern "C" int here(void) { return 0; }\n')
    assert [(e.name, e.via) for e in doc.exports] == [("here", "extern_c")]


def test_torch_library_exports() -> None:
    doc = _doc("torch_library.cu")
    defs = [(e.name, e.via, e.library, e.dispatch_key, e.function, e.schema) for e in doc.exports]
    assert defs == [
        ("gelu", "torch_library", "kernel_ops", None, None, "gelu(Tensor x) -> Tensor"),
        ("gelu", "torch_library_impl", "kernel_ops", "CUDA", "gelu_cuda", None),
    ]
    (target,) = [t for t in doc.targets if t.kind is TargetKind.HOST_EXPORT]
    assert target.name == "gelu" and target.data["function"] == "gelu_cuda"
    assert _at(doc.text, target.name_span) == "gelu_cuda"


# -- macros and constants ----------------------------------------------------------------

def test_defines_and_constexpr_constants() -> None:
    doc = _doc("softmax.cu")
    defines = {d.name: d for d in doc.defines}
    assert set(defines) == {"WARP_SIZE", "BLOCK_THREADS"}  # CEIL_DIV is function-like
    block = defines["BLOCK_THREADS"]
    assert (block.value, block.int_value) == ("(8 * WARP_SIZE)", 256)  # the comment is not the value
    assert _at(doc.text, block.value_span) == "(8 * WARP_SIZE)"
    assert _at(doc.text, block.name_span) == "BLOCK_THREADS"
    consts = {c.name: c for c in doc.constants}
    assert (consts["kRowsPerBlock"].type, consts["kRowsPerBlock"].int_value) == ("int", 1)
    assert (consts["kUnroll"].type, consts["kUnroll"].value, consts["kUnroll"].int_value) == ("unsigned", "4u", 4)
    assert _at(doc.text, consts["kUnroll"].value_span) == "4u"


def test_constants_inside_kernels_and_non_integers() -> None:
    text = ("#define TILE 0x20\n#define EMPTY\n#define OCT 010\n"
            "constexpr float kScale = 0.5f;\nconstexpr int A = TILE * 2, B = A << 1;\n"
            "__global__ void k() { constexpr int kWarps = B / 32; }\n")
    doc = parse_document("c.cu", text)
    assert [(d.name, d.value, d.int_value) for d in doc.defines] == [
        ("TILE", "0x20", 32), ("EMPTY", "", None), ("OCT", "010", 8)]
    assert [(c.name, c.int_value, c.function) for c in doc.constants] == [
        ("A", 64, None), ("B", 128, None), ("kWarps", 4, "k")]


# -- positions ---------------------------------------------------------------------------

def test_target_at_finds_the_innermost_target() -> None:
    doc = _doc("softmax.cu")
    assert doc.target_at(40, 4).name == "softmax_kernel"   # inside the body
    assert doc.target_at(26, 0).name == "softmax_kernel"   # on the template line
    assert doc.target_at(14, 2) is None                    # inside a __device__ function
    assert doc.target_at(57, 2).name == "fill_kernel"


def test_non_ascii_columns_are_code_points() -> None:
    text = ("/* ∑ softmax — naïve */ __global__ void k_ü(float* x) { x[0] = 1; }\n"
            "void go() { /* 🙂 */ k_ü<<<1, 1>>>(nullptr); }\n"
            "#define NAME_É 3 // é\n")
    doc = parse_document("u.cu", text)
    (kernel,) = doc.kernels
    assert kernel.name == "k_ü"
    assert _at(text, kernel.name_span) == "k_ü"
    assert kernel.name_span.start_col == text.split("\n")[0].index("k_ü")
    (launch,) = doc.launches
    assert _at(text, launch.config_span) == "<<<1, 1>>>"
    assert _at(text, doc.defines[0].value_span) == "3"


def test_text_in_comments_and_strings_is_not_code() -> None:
    text = ('// __global__ void fake(int x) {}\nconst char* s = "__global__ void nope() {} k<<<1,1>>>()";\n'
            "/* #define HIDDEN 1 */\n__global__ void real() {}\n")
    doc = parse_document("c.cu", text)
    assert [k.name for k in doc.kernels] == ["real"]
    assert doc.launches == [] and doc.defines == []


# -- bad input ---------------------------------------------------------------------------

def test_broken_syntax_still_yields_kernels() -> None:
    text = ("__global__ void good(float* a) { a[0] = 1; }\n"
            "__global__ void broken(float* x) { int i = ; x[i] = \n"
            "__global__ void after(float* y, int n) { y[0] = 1; }\n")
    doc = parse_document("b.cu", text)
    assert doc.syntax_errors, "the missing expression is reported"
    names = [k.name for k in doc.kernels]
    assert names == ["good", "broken", "after"]
    after = doc.kernels[2]
    assert _at(text, after.name_span) == "after"
    assert after.data["params"] == [{"type": "float*", "name": "y"}, {"type": "int", "name": "n"}]


def test_unbalanced_and_garbage_text_never_raises() -> None:
    for text in ["", "\n\n", "}}}}{{{{", "__global__", "__global__ void (", "k<<<", "#define",
                 "extern \"C\" {", "PYBIND11_MODULE(", "\0\0\0", "\ud800 lone surrogate", "é" * 1000,
                 "template <", "m.def(\"x\"", "__global__ void k(" * 50]:
        doc = parse_document("odd.cu", text)
        assert doc.text == text
        assert isinstance(doc.targets, list)


def test_empty_and_unknown_files() -> None:
    empty = parse_document("e.cu", "")
    assert (empty.language, empty.targets, empty.syntax_errors) == ("cuda", [], [])
    other = parse_document("notes.txt", "__global__ void k() {}")
    assert (other.language, other.tree, other.targets) == ("", None, [])
    assert parse_document("k.CUH", "__global__ void k() {}").kernels[0].name == "k"
    with pytest.raises(TypeError, match="str"):
        parse_document("k.cu", b"__global__ void k() {}")  # type: ignore[arg-type]


def test_read_text_replaces_bad_bytes_and_refuses_binary(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.cu"
    bad.write_bytes(b"// caf\xe9\n__global__ void k() {}\n")
    text = read_text(bad)
    assert text.startswith("// caf\ufffd\n")
    assert parse_document(str(bad), text).kernels[0].name == "k"
    binary = tmp_path / "blob.cu"
    binary.write_bytes(b"\x7fELF\x00\x00\x01")
    with pytest.raises(SourceError, match="binary"):
        read_text(binary)
    with pytest.raises(SourceError, match="cannot read"):
        read_text(tmp_path / "missing.cu")


# -- incremental -------------------------------------------------------------------------

EDITS = [
    ("rename a kernel", lambda t: t.replace("fill_kernel(float* p", "fill_kernel2(float* p")),
    ("insert a kernel", lambda t: t.replace("namespace detail {",
                                            "__global__ void added(int* q) { q[0] = 0; }\nnamespace detail {")),
    ("non-ASCII comment", lambda t: t.replace("// eight warps", "// huit warps — ü")),
    ("break the syntax", lambda t: t.replace("if (i < n) p[i] = v;", "if (i < n p[i] = ")),
    ("repair it", lambda t: t.replace("if (i < n p[i] = ", "if (i < n) p[i] = v;")),
    ("change a define", lambda t: t.replace("#define WARP_SIZE 32", "#define WARP_SIZE 64")),
    ("delete everything", lambda t: ""),
    ("type it back", lambda t: read_text(DATA / "softmax.cu")),
]


def test_incremental_reparse_matches_a_fresh_parse() -> None:
    path = str(DATA / "softmax.cu")
    doc = parse_document(path, read_text(DATA / "softmax.cu"))
    for what, edit in EDITS:
        new_text = edit(doc.text)
        old_summary = summary(doc)
        incremental = parse_document(path, new_text, old=doc)
        fresh = parse_document(path, new_text)
        assert summary(incremental) == summary(fresh), what
        assert summary(doc) == old_summary, f"{what}: the old Document must not change"
        doc = incremental
    assert [k.name for k in doc.kernels] == ["softmax_kernel", "fill_kernel"]


def test_incremental_parse_edits_a_copy_of_the_old_tree() -> None:
    from kernel_lsp.source.document import _edited_tree
    from kernel_lsp.source.text import LineIndex, encode

    old = parse_document("k.cu", "// é\n__global__ void k(float* x) { x[0] = 1; }\n")
    new_text = old.text.replace("x[0] = 1;", "x[0] = 2; /* ü */")
    tree = _edited_tree(old, new_text, encode(new_text), LineIndex(new_text))
    assert tree is not None and tree.root_node.has_changes
    assert not old.tree.root_node.has_changes  # the old Document's tree is untouched
    changed = tree.root_node.descendant_for_byte_range(len(encode("// é\n__global__ void k(float* x) { x[0] = ")),
                                                       len(encode("// é\n__global__ void k(float* x) { x[0] = 2")))
    assert changed.has_changes
    new = parse_document("k.cu", new_text, old=old)
    assert new.kernels[0].span == Span(1, 0, 1, len(new_text.split("\n")[1]))  # code points, not bytes


# -- size --------------------------------------------------------------------------------

def _big_cuda(lines: int) -> tuple[str, int]:
    """Copies of softmax.cu with distinct names, `lines` long; returns (text, copies)."""
    block = read_text(DATA / "softmax.cu")
    parts: list[str] = []
    i = 0
    while sum(p.count("\n") for p in parts) < lines:
        parts.append(block.replace("softmax_kernel", f"softmax_kernel_{i}").replace("fill_kernel", f"fill_{i}")
                     .replace("softmax_forward", f"forward_{i}").replace("softmax_launch", f"launch_{i}")
                     .replace("fill_launch", f"fill_launch_{i}").replace("kernel_count", f"count_{i}")
                     .replace("namespace detail", f"namespace detail{i}"))
        i += 1
    return "".join(parts), i


def test_twenty_thousand_lines_parse_fast() -> None:
    text, copies = _big_cuda(20_000)
    assert text.count("\n") >= 20_000
    started = time.perf_counter()
    doc = parse_document("big.cu", text)
    fresh = time.perf_counter() - started
    kernels = len(doc.kernels)
    assert kernels == 2 * copies and len(doc.launches) == 3 * copies and len(doc.exports) == 4 * copies
    started = time.perf_counter()
    again = parse_document("big.cu", text.replace("int rows, int cols) {", "int rows, int cols)  {", 1), old=doc)
    incremental = time.perf_counter() - started
    assert len(again.kernels) == kernels
    # Measured on a quiet 2-core machine: about 0.35 s fresh (0.2 s of it tree-sitter's own
    # parse) for ~480 kernels; the bound is generous for loaded CI machines.
    assert fresh < 5.0, f"fresh parse of 20,000 lines took {fresh:.2f} s"
    assert incremental < 5.0, f"incremental re-parse took {incremental:.2f} s"
