"""Facts from a Python tree (tree-sitter-python): the KernelBench task shape (Model,
ModelNew, get_inputs, get_init_inputs), other nn.Modules, Triton kernels, CUDA/C++ text
passed to `torch.utils.cpp_extension.load_inline`, and `.cu` files given to `load`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tree_sitter import Language, Node, Query, QueryCursor

from kernel_lsp.model import Span, Target, TargetKind
from kernel_lsp.source.pystrings import content_bounds, literal_value
from kernel_lsp.source.records import EmbeddedSource, TaskInfo
from kernel_lsp.source.text import LineIndex

_MODULE_BASES = {"nn.Module", "torch.nn.Module", "Module"}
_TRITON_JIT = {"triton.jit", "jit", "triton.language.jit"}
_TRITON_OTHER = {"triton.autotune", "autotune", "triton.heuristics", "heuristics"}
_SCOPES = {"function_definition", "class_definition", "lambda"}
_WS = re.compile(r"\s+")

_QUERIES: dict[int, tuple[Query, Query, Query]] = {}


def _queries(language: Language) -> tuple[Query, Query, Query]:
    key = id(language)
    if key not in _QUERIES:
        _QUERIES[key] = (
            Query(language, "(class_definition) @class (decorated_definition) @decorated"),
            Query(language, """
                (call function: [(identifier) @fn (attribute attribute: (identifier) @fn)]
                      (#any-of? @fn "load_inline" "load")) @call"""),
            Query(language, "(assignment left: (identifier) @name right: (_) @value) @assignment"),
        )
    return _QUERIES[key]


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
    def __init__(self, tree, lines: LineIndex, path: str, language: Language) -> None:
        self.tree = tree
        self.lines = lines
        self.path = path
        self.language = language
        self.facts = PythonFacts()
        self._assignments: list[tuple[str, Node, Node]] | None = None

    def read(self) -> PythonFacts:
        q_defs, q_calls, _ = _queries(self.language)
        captures = QueryCursor(q_defs).captures(self.tree.root_node)
        self._classes(captures.get("class", []))
        for dec in captures.get("decorated", []):
            self._decorated(dec)
        self._task_functions()
        for call in sorted(QueryCursor(q_calls).captures(self.tree.root_node).get("call", []),
                           key=lambda n: n.start_byte):
            self._extension_call(call)
        self.facts.targets.sort(key=lambda t: (t.span.start_line, t.span.start_col))
        return self.facts

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
                      "forward_span": self.lines.span(forward).to_dict() if forward is not None else None}))
            task = self.facts.task
            if kind is TargetKind.TASK_MODEL and not task.has_model:
                task.has_model = True
                task.spans["Model"] = span
            elif kind is TargetKind.CANDIDATE_MODEL and not task.has_model_new:
                task.has_model_new = True
                task.spans["ModelNew"] = span

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
            for kind, key, index in (("cpp", "cpp_sources", 1), ("cuda", "cuda_sources", 2)):
                value = keywords.get(key) or (positional[index] if len(positional) > index else None)
                if value is not None:
                    self._embedded(value, kind, call, module_name, functions)
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
        if self._assignments is None:
            _, _, q_assign = _queries(self.language)
            self._assignments = []
            for _, match in QueryCursor(q_assign).matches(self.tree.root_node):
                n, v = match.get("name"), match.get("value")
                if n and v:
                    self._assignments.append((_text(n[0]), n[0], v[0]))
            self._assignments.sort(key=lambda a: a[1].start_byte)
        best = None
        for bound_name, name_node, value in self._assignments:
            if bound_name != name:
                continue
            if name_node.start_byte < before.start_byte or best is None:
                best = value
        return best

    def _embedded(self, value: Node, kind: str, call: Node, module_name: str | None,
                  functions: list[str]) -> None:
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
            a, b = self.lines.position(bounds[0]), self.lines.position(bounds[1])
            self.facts.embedded.append(EmbeddedSource(
                text=text, kind=kind,  # type: ignore[arg-type]
                span=Span(a[0], a[1], b[0], b[1]), call_span=self.lines.span(call), variable=var,
                module_name=module_name, functions=list(functions),
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


def read_python(tree, lines: LineIndex, path: str, language: Language) -> PythonFacts:
    return _Reader(tree, lines, path, language).read()
