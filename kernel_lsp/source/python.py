"""Facts from a Python tree (tree-sitter-python): the KernelBench task shape (Model,
ModelNew, get_inputs, get_init_inputs), other nn.Modules, Triton kernels, CUDA/C++ text
passed to `torch.utils.cpp_extension.load_inline`, and `.cu` files given to `load`.

As in cuda.py, a regex over the bytes finds candidates and the tree confirms each one.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from tree_sitter import Language, Node

from kernel_lsp.model import Span, Target, TargetKind
from kernel_lsp.source.pystrings import content_bounds, literal_value
from kernel_lsp.source.records import EmbeddedSource, TaskInfo
from kernel_lsp.source.text import LineIndex, span_dict

_MODULE_BASES = {"nn.Module", "torch.nn.Module", "Module"}
_TRITON_JIT = {"triton.jit", "jit", "triton.language.jit"}
_TRITON_OTHER = {"triton.autotune", "autotune", "triton.heuristics", "heuristics"}
_SCOPES = {"function_definition", "class_definition", "lambda"}
_WS = re.compile(r"\s+")

_CLASS = re.compile(rb"\bclass\b")
_DECORATOR = re.compile(rb"@")
_EXTENSION_CALL = re.compile(rb"\b(?:load_inline|load)\s*\(")
_CLASS_LINE = re.compile(r"class\s+(\w+)\s*(?:\(([^)]*)\))?\s*:")
_ASSIGNMENT = re.compile(rb"\b([A-Za-z_]\w*)\s*=(?!=)")


@dataclass
class PythonFacts:
    targets: list[Target] = field(default_factory=list)
    task: TaskInfo = field(default_factory=TaskInfo)
    embedded: list[EmbeddedSource] = field(default_factory=list)
    loaded_files: list[str] = field(default_factory=list)


def _text(node: Node | None) -> str:
    if node is None or node.text is None:
        return ""
    return node.text.decode("utf-8", "replace")


def _squash(text: str) -> str:
    return _WS.sub(" ", text).strip()


def _is_module_level(node: Node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type in _SCOPES:
            return False
        parent = parent.parent
    return True


def _params(parameters: Node | None) -> list[str]:
    """Parameter texts as written (`x`, `dim=1`, `*args`), without `self`."""
    if parameters is None:
        return []
    out = [_squash(_text(p)) for p in parameters.named_children if p.type != "comment"]
    return out[1:] if out and out[0] in ("self", "cls") else out


def _methods(body: Node | None) -> dict[str, Node]:
    found: dict[str, Node] = {}
    if body is None:
        return found
    for child in body.named_children:
        fn = child.child_by_field_name("definition") if child.type == "decorated_definition" else child
        if fn is not None and fn.type == "function_definition":
            found.setdefault(_text(fn.child_by_field_name("name")), fn)
    return found


def _dotted(node: Node | None) -> str:
    """`triton.jit` for a decorator `@triton.jit` or `@triton.jit(...)`."""
    if node is None:
        return ""
    if node.type == "decorator":
        node = node.named_children[0] if node.named_children else None
    if node is not None and node.type == "call":
        node = node.child_by_field_name("function")
    return _squash(_text(node)) if node is not None and node.type in ("identifier", "attribute") else ""


class _Reader:
    def __init__(self, tree, lines: LineIndex, path: str, language: Language, source: bytes) -> None:
        self.tree = tree
        self.source = source
        self.lines = lines
        self.path = path
        self.language = language
        self.facts = PythonFacts()
        self._assignments: dict[str, list[tuple[Node, Node]]] = {}
        self._assignment_hits: dict[bytes, list[int]] | None = None

    def _tokens(self, pattern: re.Pattern[bytes]):
        """Tree nodes at each regex hit: the text finds candidates, the tree confirms them."""
        root = self.tree.root_node
        for m in pattern.finditer(self.source):
            node = root.descendant_for_byte_range(m.start(), m.start() + 1)
            if node is not None:
                yield node

    def read(self) -> PythonFacts:
        classes, stray = [], []
        for t in self._tokens(_CLASS):
            if t.type == "class" and t.parent is not None and t.parent.type == "class_definition":
                classes.append(t.parent)
            elif t.start_point[1] == 0 and self.tree.root_node.has_error:
                stray.append(t)  # a top-level `class` that error recovery swallowed
        self._classes(classes)
        for tok in stray:
            self._recover_class(tok)
        seen: set[int] = set()
        for tok in self._tokens(_DECORATOR):
            dec = tok.parent.parent if tok.type == "@" and tok.parent is not None else None
            if dec is not None and tok.parent.type == "decorator" and dec.type == "decorated_definition" \
                    and dec.id not in seen:
                seen.add(dec.id)
                self._decorated(dec)
        self._task_functions()
        for tok in self._tokens(_EXTENSION_CALL):
            call = self._call_of(tok)
            if call is not None:
                self._extension_call(call)
        self.facts.targets.sort(key=lambda t: (t.span.start_line, t.span.start_col))
        return self.facts

    @staticmethod
    def _call_of(tok: Node) -> Node | None:
        """The call whose callee is `tok` (`load_inline(...)` or `cpp_extension.load_inline(...)`)."""
        if tok.type != "identifier" or tok.parent is None:
            return None
        callee = tok.parent if tok.parent.type == "attribute" and tok.parent.child_by_field_name("attribute") == tok else tok
        call = callee.parent
        if call is None or call.type != "call" or call.child_by_field_name("function") != callee:
            return None
        return call

    # -- classes -----------------------------------------------------------------------
    def _classes(self, classes: list[Node]) -> None:
        bases_of: dict[int, list[str]] = {}
        names: dict[str, Node] = {}
        for cls in classes:
            supers = cls.child_by_field_name("superclasses")
            bases_of[cls.id] = [_squash(_text(b)) for b in supers.named_children
                                if b.type in ("identifier", "attribute")] if supers is not None else []
            names.setdefault(_text(cls.child_by_field_name("name")), cls)
        # A class deriving from a module class of this file is a module too.
        modules = set(_MODULE_BASES)
        changed = True
        while changed:
            changed = False
            for cls in classes:
                name = _text(cls.child_by_field_name("name"))
                if name not in modules and any(b in modules for b in bases_of[cls.id]):
                    modules.add(name)
                    changed = True
        for cls in sorted(classes, key=lambda n: n.start_byte):
            name_node = cls.child_by_field_name("name")
            name = _text(name_node)
            top = _is_module_level(cls)
            if top and name == "Model":
                kind = TargetKind.TASK_MODEL
            elif top and name == "ModelNew":
                kind = TargetKind.CANDIDATE_MODEL
            elif any(b in modules for b in bases_of[cls.id]):
                kind = TargetKind.NN_MODULE
            else:
                continue
            methods = _methods(cls.child_by_field_name("body"))
            init, forward = methods.get("__init__"), methods.get("forward")
            init_params = _params(init.child_by_field_name("parameters")) if init is not None else []
            forward_params = _params(forward.child_by_field_name("parameters")) if forward is not None else []
            outer = cls.parent if cls.parent is not None and cls.parent.type == "decorated_definition" else cls
            span = self.lines.span(outer)
            bases = bases_of[cls.id]
            self.facts.targets.append(Target(
                name=name, kind=kind, path=self.path, span=span, name_span=self.lines.span(name_node),
                detail=f"class {name}({', '.join(bases)})" if bases else f"class {name}",
                data={"bases": bases, "init_params": init_params, "forward_params": forward_params,
                      "forward_span": span_dict(self.lines.span(forward)) if forward is not None else None}))
            task = self.facts.task
            if kind is TargetKind.TASK_MODEL and not task.has_model:
                task.has_model = True
                task.spans["Model"] = span
            elif kind is TargetKind.CANDIDATE_MODEL and not task.has_model_new:
                task.has_model_new = True
                task.spans["ModelNew"] = span

    def _recover_class(self, tok: Node) -> None:
        """A class the tree lost to a syntax error above it, read from its text (indentation
        says where it ends)."""
        lines = self.lines
        row = tok.start_point[0]
        m = _CLASS_LINE.match(lines.line(row))
        if m is None:
            return
        name, bases_text = m.group(1), m.group(2) or ""
        bases = [b.strip() for b in bases_text.split(",") if b.strip() and "=" not in b]
        modules = _MODULE_BASES | {t.name for t in self.facts.targets if t.kind is not TargetKind.TRITON_KERNEL}
        if name == "Model":
            kind = TargetKind.TASK_MODEL
        elif name == "ModelNew":
            kind = TargetKind.CANDIDATE_MODEL
        elif any(b in modules for b in bases):
            kind = TargetKind.NN_MODULE
        else:
            return
        end = row
        for r in range(row + 1, lines.line_count):
            line = lines.line(r)
            if line.strip() and not line[0].isspace() and not line.startswith("#"):
                break
            if line.strip():
                end = r
        span = Span(row, 0, end, len(lines.line(end)))
        name_col = m.start(1)
        self.facts.targets.append(Target(
            name=name, kind=kind, path=self.path, span=span,
            name_span=Span(row, name_col, row, name_col + len(name)),
            detail=f"class {name}({', '.join(bases)})" if bases else f"class {name}",
            data={"bases": bases, "init_params": [], "forward_params": [], "forward_span": None,
                  "recovered": True}))
        task = self.facts.task
        if kind is TargetKind.TASK_MODEL and not task.has_model:
            task.has_model, task.spans["Model"] = True, span
        elif kind is TargetKind.CANDIDATE_MODEL and not task.has_model_new:
            task.has_model_new, task.spans["ModelNew"] = True, span

    # -- triton ------------------------------------------------------------------------
    def _decorated(self, dec: Node) -> None:
        fn = dec.child_by_field_name("definition")
        if fn is None or fn.type != "function_definition":
            return
        names = [_dotted(d) for d in dec.named_children if d.type == "decorator"]
        if not any(n in _TRITON_JIT for n in names):
            return
        name_node = fn.child_by_field_name("name")
        parameters = fn.child_by_field_name("parameters")
        params, constexpr = [], []
        for p in (parameters.named_children if parameters is not None else []):
            text = _squash(_text(p))
            params.append(text)
            annotation = p.child_by_field_name("type")
            if annotation is not None and _squash(_text(annotation)).endswith("constexpr"):
                pname = p.named_children[0] if p.named_children else None
                constexpr.append(_text(pname))
        self.facts.targets.append(Target(
            name=_text(name_node), kind=TargetKind.TRITON_KERNEL, path=self.path,
            span=self.lines.span(dec), name_span=self.lines.span(name_node),
            detail=f"def {_text(name_node)}({', '.join(params)})",
            data={"decorators": names, "params": params, "constexpr_params": constexpr,
                  "autotune": any(n in ("triton.autotune", "autotune") for n in names),
                  "heuristics": any(n in ("triton.heuristics", "heuristics") for n in names)}))

    # -- task functions ------------------------------------------------------------------
    def _task_functions(self) -> None:
        stack = [self.tree.root_node]
        task = self.facts.task
        while stack:
            node = stack.pop()
            for child in node.named_children:
                t = child.type
                fn = child.child_by_field_name("definition") if t == "decorated_definition" else child
                if fn is not None and fn.type == "function_definition":
                    name = _text(fn.child_by_field_name("name"))
                    if name == "get_inputs" and not task.has_get_inputs:
                        task.has_get_inputs = True
                        task.spans["get_inputs"] = self.lines.span(child)
                    elif name == "get_init_inputs" and not task.has_get_init_inputs:
                        task.has_get_init_inputs = True
                        task.spans["get_init_inputs"] = self.lines.span(child)
                elif t in ("if_statement", "try_statement", "block", "else_clause", "elif_clause",
                           "except_clause", "finally_clause", "with_statement"):
                    stack.append(child)

    # -- load_inline / load ------------------------------------------------------------
    def _extension_call(self, call: Node) -> None:
        fn = call.child_by_field_name("function")
        fname = _text(fn.child_by_field_name("attribute") if fn is not None and fn.type == "attribute" else fn)
        args = call.child_by_field_name("arguments")
        if args is None:
            return
        positional = [a for a in args.named_children if a.type not in ("keyword_argument", "comment")]
        keywords = {_text(a.child_by_field_name("name")): a.child_by_field_name("value")
                    for a in args.named_children if a.type == "keyword_argument"}
        if fname == "load_inline":
            module_name = self._literal(keywords.get("name") or (positional[0] if positional else None))
            functions = self._string_list(keywords.get("functions"))
            # load_inline prepends its headers unless no_implicit_headers is (literally) true.
            bare = _text(keywords.get("no_implicit_headers")) in ("True", "1")
            for kind, key, index in (("cpp", "cpp_sources", 1), ("cuda", "cuda_sources", 2)):
                value = keywords.get(key) or (positional[index] if len(positional) > index else None)
                if value is not None:
                    self._embedded(value, kind, call, module_name, functions, not bare)
        else:  # load(name, sources, ...): only cpp_extension's load takes sources
            sources = keywords.get("sources") or (positional[1] if len(positional) > 1 else None)
            if sources is None or sources.type not in ("list", "tuple", "identifier", "string"):
                return
            sources = self._resolve(sources, call)
            items = sources.named_children if sources.type in ("list", "tuple") else [sources]
            for item in items:
                path = self._path_literal(item, call)
                if path is not None and path not in self.facts.loaded_files:
                    self.facts.loaded_files.append(path)

    def _literal(self, node: Node | None) -> str | None:
        if node is None:
            return None
        got = literal_value(node, self.lines)
        return got[0] if got is not None else None

    def _string_list(self, node: Node | None) -> list[str]:
        if node is None:
            return []
        items = node.named_children if node.type in ("list", "tuple") else [node]
        return [v for v in (self._literal(i) for i in items) if v is not None]

    def _path_literal(self, node: Node, call: Node) -> str | None:
        """A source path: a literal, a name bound to one, or the last literal inside
        os.path.join(...) / Path(...) / a / "x.cu"."""
        node = self._resolve(node, call)
        value = self._literal(node)
        if value is not None:
            return value
        last = None
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type == "string":
                if last is None or n.start_byte > last.start_byte:
                    last = n
                continue
            stack.extend(n.named_children)
        return self._literal(last)

    def _resolve(self, node: Node, call: Node) -> Node:
        """Follow a name to the value it was last bound to before `call`."""
        seen = 0
        while node.type == "identifier" and seen < 8:
            bound = self._binding(_text(node), call)
            if bound is None:
                break
            node = bound
            seen += 1
        return node

    def _binding(self, name: str, before: Node) -> Node | None:
        """The value last bound to `name` by `name = value` before `before` (else the first after)."""
        if self._assignment_hits is None:  # one pass over the text for every name
            self._assignment_hits = {}
            for m in _ASSIGNMENT.finditer(self.source):
                self._assignment_hits.setdefault(m.group(1), []).append(m.start(1))
        if name not in self._assignments:
            found = []
            root = self.tree.root_node
            for pos in self._assignment_hits.get(name.encode("utf-8", "replace"), []):
                tok = root.descendant_for_byte_range(pos, pos + 1)
                parent = tok.parent if tok is not None else None
                if parent is not None and tok.type == "identifier" and parent is not None and parent.type == "assignment" \
                        and parent.child_by_field_name("left") == tok:
                    value = parent.child_by_field_name("right")
                    if value is not None:
                        found.append((tok, value))
            self._assignments[name] = found
        bound = self._assignments[name]
        if not bound:
            return None
        # the bindings are in text order: the last one before `before`, else the first
        i = bisect.bisect_left([n.start_byte for n, _ in bound], before.start_byte)
        return bound[i - 1][1] if i > 0 else bound[0][1]

    def _embedded(self, value: Node, kind: str, call: Node, module_name: str | None,
                  functions: list[str], implicit_headers: bool = True) -> None:
        items = [value]
        variable = value.type == "identifier" and _text(value) or None
        resolved = self._resolve(value, call)
        if resolved.type in ("list", "tuple"):
            items = list(resolved.named_children)
            variable = None
        for item in items:
            var = variable
            if item.type == "identifier":
                var = _text(item)
            got = self._string_node_value(self._resolve(item, call), call)
            if got is None:
                continue
            text, offsets, bounds = got
            if not text.strip():
                continue  # cpp_sources="" holds no code
            a, b = self.lines.position(bounds[0]), self.lines.position(bounds[1])
            self.facts.embedded.append(EmbeddedSource(
                text=text, kind=kind,  # type: ignore[arg-type]
                span=Span(a[0], a[1], b[0], b[1]), call_span=self.lines.span(call), variable=var,
                module_name=module_name, functions=list(functions), implicit_headers=implicit_headers,
                _offsets=offsets, _file=self.lines))

    def _string_node_value(self, node: Node, call: Node) -> tuple[str, list[int], tuple[int, int]] | None:
        """(value, file offsets, content bounds) of a literal, or of `a + b` of literals/names."""
        while node.type == "parenthesized_expression" and node.named_child_count == 1:
            node = node.named_children[0]
        if node.type == "binary_operator" and _text(node.child_by_field_name("operator")) == "+":
            left = self._string_node_value(self._resolve(node.child_by_field_name("left"), call), call)
            right = self._string_node_value(self._resolve(node.child_by_field_name("right"), call), call)
            if left is None or right is None:
                return None
            offsets = left[1][:-1] + right[1]
            lo, hi = min(left[2][0], right[2][0]), max(left[2][1], right[2][1])
            return left[0] + right[0], offsets, (lo, hi)
        got = literal_value(node, self.lines)
        bounds = content_bounds(node, self.lines)
        if got is None or bounds is None:
            return None
        return got[0], got[1], bounds


def read_python(tree, lines: LineIndex, path: str, language: Language, source: bytes) -> PythonFacts:
    return _Reader(tree, lines, path, language, source).read()
