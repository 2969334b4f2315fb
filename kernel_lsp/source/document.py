"""A parsed source file and everything kernel-lsp reads from it.

`parse_document(path, text, old=None)` picks the grammar by extension, re-parses
incrementally when the previous Document is given, and never raises on odd text:
syntax errors become `Document.syntax_errors` and tree-sitter's error recovery still
yields what it can.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import tree_sitter_cuda
import tree_sitter_python
from tree_sitter import Language, Parser, Tree

from kernel_lsp.model import Span, Target, TargetKind
from kernel_lsp.source.cuda import find_host_function, read_cuda
from kernel_lsp.source.python import read_python
from kernel_lsp.source.records import Constant, Define, EmbeddedSource, Export, HostFunction, Launch, TaskInfo
from kernel_lsp.source.text import LineIndex, encode, span_dict

log = logging.getLogger(__name__)

CUDA_EXTENSIONS = (".cu", ".cuh", ".cuda")
PYTHON_EXTENSIONS = (".py",)

_LANGUAGES: dict[str, Language] = {}
_local = threading.local()  # Parser objects are not thread-safe: one per thread and language


def language_for(path: str) -> str:
    """"cuda", "python", or "" (not a file kernel-lsp reads)."""
    ext = os.path.splitext(path)[1].lower()
    if ext in CUDA_EXTENSIONS:
        return "cuda"
    if ext in PYTHON_EXTENSIONS:
        return "python"
    return ""


def _language(name: str) -> Language:
    if name not in _LANGUAGES:
        module = tree_sitter_cuda if name == "cuda" else tree_sitter_python
        _LANGUAGES[name] = Language(module.language())
    return _LANGUAGES[name]


def _parser(name: str) -> Parser:
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    if name not in parsers:
        parsers[name] = Parser(_language(name))
    return parsers[name]


@dataclass
class Document:
    """One parsed file. Target.data by kind:

    - CUDA_KERNEL: template_params [{name, kind: type|value|type_pack|template, type, default}],
      launch_bounds [str], launch_bounds_values [int|None], params [{type, name}],
      qualified_name (in a namespace), embedded (index, in a .py), recovered (read from text
      after a syntax error)
    - HOST_EXPORT: via, function, binding_span, library, dispatch_key, schema, params
    - TASK_MODEL / CANDIDATE_MODEL / NN_MODULE: bases, init_params, forward_params, forward_span
    - TRITON_KERNEL: decorators, params, constexpr_params, autotune, heuristics
    - EMBEDDED_CUDA: embedded, variable, module_name, functions, kernels
    """

    path: str
    text: str
    language: str = ""                  # "cuda" | "python" | ""
    tree: Tree | None = field(default=None, repr=False)
    targets: list[Target] = field(default_factory=list)      # every Target, in document order
    launches: list[Launch] = field(default_factory=list)
    exports: list[Export] = field(default_factory=list)
    defines: list[Define] = field(default_factory=list)
    constants: list[Constant] = field(default_factory=list)
    embedded: list[EmbeddedSource] = field(default_factory=list)
    host_functions: dict[str, HostFunction] = field(default_factory=dict)  # those looked up so far
    loaded_files: list[str] = field(default_factory=list)    # load(sources=[...]) paths, as written
    task: TaskInfo = field(default_factory=TaskInfo)
    syntax_errors: list[Span] = field(default_factory=list)
    parse_seconds: float = 0.0
    lines: LineIndex | None = field(default=None, repr=False)
    source: bytes = field(default=b"", repr=False)           # the UTF-8 bytes the tree was built from
    _host_missing: set[str] = field(default_factory=set, repr=False, compare=False)
    _by_call: dict[Span, list[int]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def kernels(self) -> list[Target]:
        return [t for t in self.targets if t.kind is TargetKind.CUDA_KERNEL]

    def target(self, name: str, kind: TargetKind | None = None) -> Target | None:
        """The first Target with this name (and kind)."""
        for t in self.targets:
            if t.name == name and (kind is None or t.kind is kind):
                return t
        return None

    def target_at(self, line: int, col: int) -> Target | None:
        """The innermost Target whose span holds (line, col)."""
        best: Target | None = None
        best_size: tuple[int, int] | None = None
        for t in self.targets:
            if not t.span.contains(line, col):
                continue
            size = (t.span.end_line - t.span.start_line, t.span.end_col - t.span.start_col)
            if best_size is None or size < best_size:
                best, best_size = t, size
        return best

    def host_function(self, name: str) -> HostFunction | None:
        """The host function definition called `name` (CUDA documents; in a Python document,
        in its embedded sources, spans mapped into the file)."""
        return self._host_function(name, None)

    def _host_function(self, name: str, call: Span | None) -> HostFunction | None:
        """With `call` (Python documents), search only that load_inline call's sources:
        a function named in its `functions=[...]` must be defined there."""
        if call is None and name in self.host_functions:
            return self.host_functions[name]
        if call is None and name in self._host_missing:
            return None
        found = None
        if self.language == "cuda" and self.tree is not None and self.lines is not None:
            found = find_host_function(self.tree, self.lines, self.path, _language("cuda"), self.source, name)
        elif self.language == "python":
            if call is not None:
                if not self._by_call:
                    for i, e in enumerate(self.embedded):
                        self._by_call.setdefault(e.call_span, []).append(i)
                indices = self._by_call.get(call, [])
            else:
                indices = list(range(len(self.embedded)))
            for index in indices:
                emb = self.embedded[index]
                if emb.document is None:
                    continue
                sub = emb.document.host_function(name)
                if sub is not None:
                    found = dataclasses.replace(sub, span=emb.map_span(sub.span),
                                                name_span=emb.map_span(sub.name_span), embedded=index)
                    break
        if call is None:
            if found is not None:
                self.host_functions[name] = found
            else:
                self._host_missing.add(name)
        return found

    def embedded_at(self, line: int, col: int) -> EmbeddedSource | None:
        for e in self.embedded:
            if e.span.contains(line, col):
                return e
        return None


def parse_document(path: str, text: str, old: Document | None = None) -> Document:
    """Parse `text` as the file `path`; with `old` (the previous Document of the same path),
    reuse its tree for an incremental parse."""
    if not isinstance(text, str):
        raise TypeError(f"parse_document needs the text as str, got {type(text).__name__}")
    started = time.perf_counter()
    language = language_for(path)
    doc = Document(path=path, text=text, language=language)
    if not language:
        return doc
    try:
        _parse(doc, old)
    except Exception:  # a reader bug must not take the server down with it
        log.exception("reading %s failed; keeping what was found", path)
    doc.parse_seconds = time.perf_counter() - started
    return doc


def _parse(doc: Document, old: Document | None) -> None:
    source = encode(doc.text)
    lines = LineIndex(doc.text)
    doc.lines, doc.source = lines, source
    parser = _parser(doc.language)
    old_tree = None
    if old is not None and old.tree is not None and old.language == doc.language and old.lines is not None:
        old_tree = _edited_tree(old, doc.text, source, lines)
    tree = parser.parse(source, old_tree) if old_tree is not None else parser.parse(source)
    doc.tree = tree
    doc.syntax_errors = _syntax_errors(tree, lines)
    language = _language(doc.language)
    if doc.language == "cuda":
        facts = read_cuda(tree, lines, doc.path, language, source)
        doc.targets = sorted(facts.kernels + facts.export_targets,
                             key=lambda t: (t.span.start_line, t.span.start_col))
        doc.launches, doc.exports = facts.launches, facts.exports
        doc.defines, doc.constants = facts.defines, facts.constants
        doc.host_functions = dict(facts.host_functions)
    else:
        facts = read_python(tree, lines, doc.path, language, source)
        doc.task, doc.loaded_files, doc.embedded = facts.task, facts.loaded_files, facts.embedded
        targets = list(facts.targets)
        targets += _embedded_facts(doc, old)
        doc.targets = sorted(targets, key=lambda t: (t.span.start_line, t.span.start_col))


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on slice equality: memcmp speed, no Python loop per char
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    la, lb = len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[la - mid:] == b[lb - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _point(lines: LineIndex, offset: int) -> tuple[int, int]:
    row, col = lines.position(offset)
    return row, lines.byte_col(row, col)


def _edited_tree(old: Document, text: str, source: bytes, lines: LineIndex) -> Tree | None:
    """The old tree, copied and edited to match `text` (one edit: the changed middle)."""
    old_text = old.text
    if old_text == text:
        return old.tree
    prefix = _common_prefix(old_text, text)
    suffix = _common_suffix(old_text, text, min(len(old_text), len(text)) - prefix)
    old_end, new_end = len(old_text) - suffix, len(text) - suffix
    start_byte = len(encode(text[:prefix]))
    old_end_byte = len(old.source) - len(encode(old_text[old_end:]))
    new_end_byte = len(source) - len(encode(text[new_end:]))
    assert old.lines is not None and old.tree is not None
    tree = old.tree.copy()  # the old Document keeps a tree that matches its text
    tree.edit(start_byte, old_end_byte, new_end_byte,
              _point(lines, prefix), _point(old.lines, old_end), _point(lines, new_end))
    return tree


def _syntax_errors(tree: Tree, lines: LineIndex) -> list[Span]:
    errors: list[Span] = []
    root = tree.root_node
    if not root.has_error:
        return errors
    stack = [root]
    while stack:  # descend only into subtrees that hold an error
        node = stack.pop()
        if node.is_error or node.is_missing:
            errors.append(lines.span(node))
            continue
        stack.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)
    errors.sort(key=lambda s: (s.start_line, s.start_col))
    return errors


def _embedded_facts(doc: Document, old: Document | None) -> list[Target]:
    """Parse each embedded source as CUDA, and lift its facts into the Python file."""
    targets: list[Target] = []
    previous = {(e.kind, e.text): e.document for e in old.embedded} if old is not None else {}
    for index, emb in enumerate(doc.embedded):
        sub = previous.get((emb.kind, emb.text))
        if sub is None:
            sub = parse_document(f"{doc.path}#embedded{index}.cu", emb.text)
        emb.document = sub

        def mapped(obj: Any) -> Any:
            changes = {f.name: emb.map_span(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                       if isinstance(getattr(obj, f.name), Span)}
            if hasattr(obj, "embedded"):
                changes["embedded"] = index
            return dataclasses.replace(obj, **changes)

        for t in sub.targets:
            data = dict(t.data, embedded=index)
            if "binding_span" in data and data["binding_span"]:
                data["binding_span"] = span_dict(emb.map_span(Span.from_dict(data["binding_span"])))
            targets.append(Target(name=t.name, kind=t.kind, path=doc.path, span=emb.map_span(t.span),
                                  name_span=emb.map_span(t.name_span), detail=t.detail, data=data))
        doc.launches += [mapped(x) for x in sub.launches]
        doc.exports += [mapped(x) for x in sub.exports]
        doc.defines += [mapped(x) for x in sub.defines]
        doc.constants += [mapped(x) for x in sub.constants]
        if emb.kind == "cuda":
            name = emb.variable or emb.module_name or f"embedded{index}"
            start = Span(emb.span.start_line, emb.span.start_col, emb.span.start_line, emb.span.start_col)
            targets.append(Target(
                name=name, kind=TargetKind.EMBEDDED_CUDA, path=doc.path, span=emb.span, name_span=start,
                detail=f"CUDA source for load_inline({emb.module_name or ''})",
                data={"embedded": index, "variable": emb.variable, "module_name": emb.module_name,
                      "functions": list(emb.functions),
                      "kernels": [t.name for t in sub.targets if t.kind is TargetKind.CUDA_KERNEL]}))
    targets += _load_inline_exports(doc)
    return targets


def _load_inline_exports(doc: Document) -> list[Target]:
    """load_inline(functions=[...]) binds these host functions for Python."""
    targets: list[Target] = []
    seen: set[tuple[str, str | None]] = set()
    for emb in doc.embedded:
        for name in emb.functions:
            if (name, emb.module_name) in seen:
                continue
            seen.add((name, emb.module_name))
            fn = doc._host_function(name, emb.call_span)
            span = fn.span if fn is not None else emb.call_span
            name_span = fn.name_span if fn is not None else emb.call_span
            doc.exports.append(Export(name=name, function=name, via="load_inline", span=span,
                                      name_span=name_span, library=emb.module_name,
                                      embedded=fn.embedded if fn is not None else None))
            targets.append(Target(
                name=name, kind=TargetKind.HOST_EXPORT, path=doc.path, span=span, name_span=name_span,
                detail=fn.detail if fn is not None else f"{name} (load_inline {emb.module_name or ''})",
                data={"via": "load_inline", "function": name, "binding_span": span_dict(emb.call_span),
                      "library": emb.module_name, "dispatch_key": None, "schema": None,
                      "params": fn.params if fn is not None else [],
                      "embedded": fn.embedded if fn is not None else None}))
    return targets
