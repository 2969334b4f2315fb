"""Facts from a CUDA/C++ tree (tree-sitter-cuda): `__global__` kernels, launch sites,
host functions exported to Python, object-like macros and constexpr integer constants.

Candidates are found by a regex over the source bytes (`__global__`, `<<<`, `#define`,
`constexpr`, `PYBIND11_MODULE`, `extern "C"`...) and each is confirmed in the tree at that
offset, so the cost follows the number of hits rather than the size of the file, and text
in comments or strings never counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tree_sitter import Language, Node

from kernel_lsp.model import Span, Target, TargetKind
from kernel_lsp.intexpr import eval_int, strip_comments
from kernel_lsp.source.records import Constant, Define, Export, HostFunction, Launch
from kernel_lsp.source.text import LineIndex, span_dict

_INTEGRAL_HINTS = ("float", "double", "half", "bfloat", "__nv_", "char*", "string")
_TORCH_LIBRARY = {"TORCH_LIBRARY": "torch_library", "TORCH_LIBRARY_FRAGMENT": "torch_library",
                  "TORCH_LIBRARY_IMPL": "torch_library_impl"}
_WS = re.compile(r"\s+")


@dataclass
class CudaFacts:
    kernels: list[Target] = field(default_factory=list)
    exports: list[Export] = field(default_factory=list)
    export_targets: list[Target] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    defines: list[Define] = field(default_factory=list)
    constants: list[Constant] = field(default_factory=list)
    host_functions: dict[str, HostFunction] = field(default_factory=dict)


def _text(node: Node | None) -> str:
    if node is None or node.text is None:
        return ""
    return node.text.decode("utf-8", "replace")


def _squash(text: str) -> str:
    return _WS.sub(" ", text).strip()


def _declarator_name(node: Node | None) -> Node | None:
    """The identifier at the bottom of a declarator chain (pointer, reference, array, function)."""
    while node is not None:
        if node.type in ("identifier", "field_identifier", "qualified_identifier", "operator_name",
                         "destructor_name", "type_identifier"):
            return node
        nxt = node.child_by_field_name("declarator")
        if nxt is None:
            # reference_declarator and friends keep the name as a plain child
            named = [c for c in node.named_children if c.type not in ("type_qualifier", "ms_call_modifier")]
            nxt = named[-1] if named else None
        node = nxt
    return None


def _function_parts(fn: Node) -> tuple[Node | None, Node | None]:
    """(name identifier, parameter_list) of a function_definition or declaration."""
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    if decl is None:
        return None, None
    return _declarator_name(decl.child_by_field_name("declarator")), decl.child_by_field_name("parameters")


def _cuda_qualifiers(fn: Node) -> set[str]:
    found = set()
    for child in fn.children:
        if child.type in ("__global__", "__device__", "__host__"):
            found.add(child.type)
        elif child.type in ("function_declarator", "compound_statement"):
            break
    return found


def _params(plist: Node | None) -> list[dict[str, str]]:
    params = []
    if plist is None:
        return params
    for p in plist.named_children:
        if p.type == "variadic_parameter":
            params.append({"type": "...", "name": ""})
            continue
        if p.type not in ("parameter_declaration", "optional_parameter_declaration",
                          "variadic_parameter_declaration"):
            continue
        name = _declarator_name(p.child_by_field_name("declarator"))
        whole = _text(p)
        if name is not None:
            a, b = name.start_byte - p.start_byte, name.end_byte - p.start_byte
            raw = p.text or b""
            type_text = (raw[:a] + raw[b:]).decode("utf-8", "replace")
            if p.type == "optional_parameter_declaration":
                type_text = type_text.split("=", 1)[0]
            params.append({"type": _squash(type_text), "name": _text(name)})
        else:
            params.append({"type": _squash(whole), "name": ""})
    return params


def _template_params(tlist: Node | None) -> list[dict[str, str | None]]:
    out: list[dict[str, str | None]] = []
    if tlist is None:
        return out
    for p in tlist.named_children:
        t = p.type
        if t == "type_parameter_declaration":
            names = [c for c in p.named_children if c.type == "type_identifier"]
            out.append({"name": _text(names[-1]) if names else "", "kind": "type", "type": None, "default": None})
        elif t == "optional_type_parameter_declaration":
            out.append({"name": _text(p.child_by_field_name("name")), "kind": "type", "type": None,
                        "default": _squash(_text(p.child_by_field_name("default_type")))})
        elif t == "variadic_type_parameter_declaration":
            names = [c for c in p.named_children if c.type == "type_identifier"]
            out.append({"name": _text(names[-1]) if names else "", "kind": "type_pack", "type": None, "default": None})
        elif t in ("parameter_declaration", "optional_parameter_declaration", "variadic_parameter_declaration"):
            name = _declarator_name(p.child_by_field_name("declarator"))
            default = p.child_by_field_name("default_value")
            out.append({"name": _text(name), "kind": "value",
                        "type": _squash(_text(p.child_by_field_name("type"))),
                        "default": _squash(_text(default)) if default is not None else None})
        elif t == "template_template_parameter_declaration":
            names = [c for c in p.named_children if c.type == "type_identifier"]
            out.append({"name": _text(names[-1]) if names else "", "kind": "template", "type": None, "default": None})
    return out


def _scope(node: Node) -> list[str]:
    names = []
    parent = node.parent
    while parent is not None:
        if parent.type == "namespace_definition":
            n = parent.child_by_field_name("name")
            if n is not None:
                names.append(_text(n))
        parent = parent.parent
    return names[::-1]


def _string_value(node: Node | None) -> str | None:
    if node is None:
        return None
    if node.type == "string_literal":
        return "".join(_text(c) for c in node.named_children)
    if node.type == "raw_string_literal":
        content = [c for c in node.named_children if c.type == "raw_string_content"]
        return _text(content[0]) if content else None
    if node.type == "concatenated_string":
        parts = [_string_value(c) for c in node.named_children]
        return "".join(p for p in parts if p is not None)
    return None


def _callee_name(node: Node | None) -> str | None:
    """The C++ function named by a binding argument: `&fn`, `fn`, `ns::fn`, `TORCH_FN(fn)`."""
    while node is not None:
        if node.type in ("identifier", "qualified_identifier"):
            return _text(node)
        if node.type == "template_function":
            return _text(node.child_by_field_name("name"))
        if node.type in ("pointer_expression", "parenthesized_expression", "cast_expression"):
            node = node.child_by_field_name("argument") or node.child_by_field_name("value") or (
                node.named_children[-1] if node.named_children else None)
            continue
        if node.type == "call_expression":  # TORCH_FN(fn), py::overload_cast<...>(&fn)
            args = node.child_by_field_name("arguments")
            node = args.named_children[0] if args is not None and args.named_children else None
            continue
        return None
    return None


def _strip_template_args(fn_node: Node) -> tuple[str, list[str]]:
    """(launched name without template arguments, template argument texts)."""
    node = fn_node
    while node.type == "qualified_identifier":
        node = node.child_by_field_name("name") or node
        if node.type != "qualified_identifier":
            break
    if node.type == "template_function":
        args = node.child_by_field_name("arguments")
        targs = [_squash(_text(a)) for a in args.named_children] if args is not None else []
        raw = fn_node.text or b""
        cut = (args.start_byte - fn_node.start_byte) if args is not None else len(raw)
        tail = (args.end_byte - fn_node.start_byte) if args is not None else len(raw)
        return _squash((raw[:cut] + raw[tail:]).decode("utf-8", "replace")), targs
    return _squash(_text(fn_node)), []


def _enclosing_function(node: Node) -> str | None:
    parent = node.parent
    while parent is not None:
        if parent.type == "function_definition":
            name, _ = _function_parts(parent)
            return _text(name) if name is not None else None
        parent = parent.parent
    return None


_KERNEL_WORD = re.compile(rb"\b__global__\b")
_BINDING_WORD = re.compile(rb"\b(?:PYBIND11_MODULE|TORCH_LIBRARY(?:_IMPL|_FRAGMENT)?)\b")
_EXTERN_C = re.compile(rb'\bextern\s*"C"')
_LAUNCH = re.compile(rb"<<<")
_DEFINE = re.compile(rb"#[ \t]*define\b")
_CONSTEXPR = re.compile(rb"\bconstexpr\b")
_CALLISH = re.compile(rb"\b([A-Za-z_]\w*)\s*\(")


def _threads(block: str, names: dict[str, int]) -> int | None:
    """`256`, `BLOCK`, `dim3(32, 8)` -> the number of threads, when every part resolves."""
    text = block.strip()
    m = re.fullmatch(r"dim3\s*[({](.*)[)}]", text, re.DOTALL)
    parts = [p for p in m.group(1).split(",")] if m else [text]
    total = 1
    for part in parts:
        value = eval_int(part, names)
        if value is None or value <= 0:
            return None
        total *= value
    return total


class _Reader:
    """Finds candidates by a regex over the bytes (C speed, proportional to the hits) and
    confirms each in the tree, so comments and strings never count."""

    def __init__(self, tree, lines: LineIndex, path: str, language: Language, source: bytes) -> None:
        self.tree = tree
        self.tree_bytes = source
        self.lines = lines
        self.path = path
        self.language = language
        self.facts = CudaFacts()
        self.extern_c_names: list[tuple[str, Node]] = []
        self.bindings: list[Node] = []              # PYBIND11_MODULE / TORCH_LIBRARY definitions
        self.missed_kernels: list[int] = []
        self._missing: set[str] = set()            # host functions looked up and not defined here         # byte offsets of __global__ the tree did not place

    def _tokens(self, pattern: re.Pattern[bytes]):
        root = self.tree.root_node
        for m in pattern.finditer(self.tree_bytes):
            node = root.descendant_for_byte_range(m.start(), m.start() + 1)
            if node is not None:
                yield m.start(), node

    # -- declarations -------------------------------------------------------------------
    def walk_declarations(self) -> None:
        for pos, tok in self._tokens(_KERNEL_WORD):
            parent = tok.parent
            if tok.type == "__global__" and parent is not None and parent.type == "function_definition":
                template = parent.parent if parent.parent is not None and parent.parent.type == "template_declaration" else None
                name, plist = _function_parts(parent)
                if name is not None:
                    self._kernel(parent, name, plist, template)
            elif tok.type == "__global__" and parent is not None and parent.type == "declaration":
                continue  # a prototype
            elif tok.type in ("identifier", "__global__", "ERROR") or (parent is not None and parent.is_error):
                self.missed_kernels.append(pos)
        for _, tok in self._tokens(_BINDING_WORD):
            if tok.type != "identifier":
                continue
            decl = tok.parent
            fn = decl.parent if decl is not None and decl.type == "function_declarator" else None
            if fn is not None and fn.type == "function_definition" and _function_parts(fn)[0] == tok:
                self.bindings.append(fn)
        for _, tok in self._tokens(_EXTERN_C):
            link = tok.parent
            if link is None or link.type != "linkage_specification":
                continue
            body = link.child_by_field_name("body")
            members = [body] if body is not None and body.type in ("function_definition", "declaration") else (
                body.named_children if body is not None else [])
            for member in members:
                if member.type in ("function_definition", "declaration"):
                    self._extern_c_member(member)
        self.facts.kernels.sort(key=lambda k: (k.span.start_line, k.span.start_col))

    def _extern_c_member(self, node: Node) -> None:
        if _cuda_qualifiers(node) & {"__global__", "__device__"}:
            return
        name, _ = _function_parts(node)
        if name is not None:
            self.extern_c_names.append((_text(name), node))

    def host_function(self, name: str) -> HostFunction | None:
        """The host function definition called `name` (the last `::` part), found by text."""
        if name not in self.facts.host_functions and name not in self._missing:
            self.find_host_functions([name])
        return self.facts.host_functions.get(name)

    def find_host_functions(self, names: list[str]) -> None:
        """Look up several host function definitions in one pass over the text."""
        wanted: dict[str, list[str]] = {}
        for name in names:
            if name not in self.facts.host_functions and name not in self._missing:
                wanted.setdefault(name.rsplit("::", 1)[-1], []).append(name)
        if not wanted:
            return
        root = self.tree.root_node
        by_bytes = {k.encode("utf-8", "replace"): k for k in wanted}
        if len(by_bytes) <= 64:  # few names: a regex of just them skips every other call
            pattern = re.compile(rb"\b(" + b"|".join(re.escape(k) for k in by_bytes) + rb")\s*\(")
        else:
            pattern = _CALLISH
        for m in pattern.finditer(self.tree_bytes):
            short = by_bytes.get(m.group(1))
            if short is None or short not in wanted:
                continue
            tok = root.descendant_for_byte_range(m.start(1), m.end(1))
            found = self._definition_of(tok, short) if tok is not None else None
            if found is None:
                continue
            ident, plist = _function_parts(found)
            span = self.lines.span(found)
            fn = HostFunction(name=short, span=span,
                              name_span=self.lines.span(ident) if ident is not None else span,
                              detail=self._signature(found), params=_params(plist))
            for full in wanted.pop(short):
                self.facts.host_functions[full] = fn
            if not wanted:
                return
        for names_left in wanted.values():
            self._missing.update(names_left)

    @staticmethod
    def _definition_of(tok: Node, short: str) -> Node | None:
        if tok.type != "identifier":
            return None
        node = tok.parent
        while node is not None and node.type in ("qualified_identifier", "function_declarator",
                                                   "pointer_declarator", "reference_declarator"):
            node = node.parent
        if node is None or node.type != "function_definition":
            return None
        ident = _function_parts(node)[0]
        if ident is None or _text(ident).rsplit("::", 1)[-1] != short:
            return None
        quals = _cuda_qualifiers(node)
        if "__global__" in quals or ("__device__" in quals and "__host__" not in quals):
            return None
        return node

    def _kernel(self, fn: Node, name: Node, plist: Node | None, template: Node | None) -> None:
        lines = self.lines
        outer = template if template is not None else fn
        body = fn.child_by_field_name("body")
        head_end = body.start_byte if body is not None else fn.end_byte
        detail = _squash(self.tree_bytes[outer.start_byte:head_end].decode("utf-8", "replace"))
        bounds = []
        for child in fn.children:
            if child.type == "launch_bounds":
                bounds = [_squash(_text(c)) for c in child.named_children if c.type != "comment"]
        tparams = _template_params(template.child_by_field_name("parameters")) if template is not None else []
        scope = _scope(fn)
        data = {
            "template_params": tparams,
            "launch_bounds": bounds,
            "params": _params(plist),
        }
        if scope:
            data["qualified_name"] = "::".join(scope + [_text(name)])
        self.facts.kernels.append(Target(
            name=_text(name), kind=TargetKind.CUDA_KERNEL, path=self.path,
            span=lines.span(outer), name_span=lines.span(name), detail=detail, data=data))

    # -- exports ------------------------------------------------------------------------
    def read_exports(self) -> None:
        for fn in self.bindings:
            self._binding_block(fn)
        self.find_host_functions([n for n, node in self.extern_c_names if node.type != "function_definition"])
        for name, node in self.extern_c_names:
            if node.type == "function_definition":
                ident, _ = _function_parts(node)
                span = self.lines.span(node)
                name_span = self.lines.span(ident) if ident is not None else span
            else:
                fn = self.host_function(name)
                if fn is None:
                    continue  # declared extern "C" but defined elsewhere: an import, not an export
                span, name_span = fn.span, fn.name_span
            self.facts.exports.append(Export(
                name=name, function=name, via="extern_c", span=span, name_span=name_span))
        seen: set[tuple[str, str | None, str]] = set()
        unique = []
        for e in self.facts.exports:
            key = (e.name, e.function, e.via)
            if key not in seen:
                seen.add(key)
                unique.append(e)
        unique.sort(key=lambda e: (e.span.start_line, e.span.start_col))
        self.facts.exports = unique
        self._export_targets()

    def _binding_block(self, fn: Node) -> None:
        ident, plist = _function_parts(fn)
        macro = _text(ident)
        args = [_squash(_text(p)) for p in plist.named_children] if plist is not None else []
        if not args:
            return
        module_var = args[-1].split()[-1] if args[-1] else "m"
        via = "pybind11" if macro == "PYBIND11_MODULE" else _TORCH_LIBRARY[macro]
        library = args[0] if via != "pybind11" else None
        key = args[1] if via == "torch_library_impl" and len(args) >= 3 else None
        body = fn.child_by_field_name("body")
        if body is None:
            return
        stack = [body]
        calls = []
        while stack:
            node = stack.pop()
            if node.type == "call_expression":
                f = node.child_by_field_name("function")
                if f is not None and f.type == "field_expression":
                    obj, member = f.child_by_field_name("argument"), f.child_by_field_name("field")
                    if _text(member) in ("def", "impl") and obj is not None and (
                            _text(obj) == module_var or obj.type == "call_expression"):
                        calls.append(node)
            stack.extend(node.named_children)
        calls.sort(key=lambda n: n.start_byte)
        for call in calls:
            arg_list = call.child_by_field_name("arguments")
            cargs = arg_list.named_children if arg_list is not None else []
            if not cargs:
                continue
            first = cargs[0]
            value = _string_value(first)
            if value is None:
                continue
            schema = None
            name = value
            if "(" in value:
                schema = value
                name = value.split("(", 1)[0].strip()
            if "::" in name:
                name = name.rsplit("::", 1)[1]
            function = _callee_name(cargs[1]) if len(cargs) > 1 else None
            self.facts.exports.append(Export(
                name=name, function=function, via=via,
                span=self.lines.span(call), name_span=self._string_content_span(first),
                library=library, dispatch_key=key, schema=schema if via != "pybind11" else None))

    def _string_content_span(self, node: Node) -> Span:
        content = [c for c in node.named_children if c.type in ("string_content", "raw_string_content")]
        if content:
            a, b = self.lines.span(content[0]), self.lines.span(content[-1])
            return Span(a.start_line, a.start_col, b.end_line, b.end_col)
        return self.lines.span(node)

    def _signature(self, fn: Node) -> str:
        body = fn.child_by_field_name("body")
        head_end = body.start_byte if body is not None else fn.end_byte
        return _squash(self.tree_bytes[fn.start_byte:head_end].decode("utf-8", "replace"))

    def _export_targets(self) -> None:
        self.find_host_functions([e.function for e in self.facts.exports if e.function])
        by_name: dict[str, Export] = {}
        for e in self.facts.exports:
            prior = by_name.get(e.name)
            if prior is None or (prior.function is None and e.function is not None):
                by_name[e.name] = e
        for name, e in by_name.items():
            fn = self.host_function(e.function) if e.function else None
            if fn is not None:
                span, name_span, detail, params = fn.span, fn.name_span, fn.detail, fn.params
            else:
                span, name_span, detail, params = e.span, e.name_span, e.schema or "", []
            self.facts.export_targets.append(Target(
                name=name, kind=TargetKind.HOST_EXPORT, path=self.path, span=span, name_span=name_span,
                detail=detail,
                data={"via": e.via, "function": e.function, "binding_span": span_dict(e.span),
                      "library": e.library, "dispatch_key": e.dispatch_key, "schema": e.schema,
                      "params": params}))
        self.facts.export_targets.sort(key=lambda t: (t.span.start_line, t.span.start_col))

    # -- queries ------------------------------------------------------------------------
    def read_launches(self) -> None:
        for _, tok in self._tokens(_LAUNCH):
            cfg = tok.parent
            if tok.type != "<<<" or cfg is None or cfg.type != "kernel_call_syntax":
                continue
            call = cfg.parent
            if call is None or call.type != "call_expression":
                continue
            fn_node = call.child_by_field_name("function")
            if fn_node is None:
                continue
            kernel, targs = _strip_template_args(fn_node)
            config = [_squash(_text(c)) for c in cfg.named_children if c.type != "comment"]
            config += [""] * (2 - len(config)) if len(config) < 2 else []
            args_node = call.child_by_field_name("arguments")
            args = [_squash(_text(a)) for a in args_node.named_children if a.type != "comment"] if args_node else []
            self.facts.launches.append(Launch(
                kernel=kernel, name=_squash(_text(fn_node)), template_args=targs,
                grid=config[0], block=config[1],
                shared_mem=config[2] if len(config) > 2 else None,
                stream=config[3] if len(config) > 3 else None,
                args=args, span=self.lines.span(call), name_span=self.lines.span(fn_node),
                config_span=self.lines.span(cfg), function=_enclosing_function(call)))

    def read_defines_and_constants(self) -> None:
        lines = self.lines
        names: dict[str, int] = {}
        for _, tok in self._tokens(_DEFINE):
            node = tok.parent
            if tok.type != "#define" or node is None or node.type != "preproc_def":
                continue
            name = node.child_by_field_name("name")
            if name is None:
                continue
            value_node = node.child_by_field_name("value")
            value, value_span = "", None
            if value_node is not None:
                start, _end = lines.node_offset(value_node)
                raw = _text(value_node)
                value = strip_comments(raw)
                if value:
                    lead = len(raw) - len(raw.lstrip())
                    a = lines.position(start + lead)
                    b = lines.position(start + lead + len(value))
                    value_span = Span(a[0], a[1], b[0], b[1])
            int_value = eval_int(value, names) if value else None
            if int_value is not None:
                names[_text(name)] = int_value
            self.facts.defines.append(Define(
                name=_text(name), value=value, int_value=int_value,
                span=lines.span(node), name_span=lines.span(name), value_span=value_span))
            # preproc_def spans end after the newline; keep the definition on its own line
            d = self.facts.defines[-1]
            if d.span.end_line > d.span.start_line and d.span.end_col == 0:
                end_line = d.span.end_line - 1
                d.span = Span(d.span.start_line, d.span.start_col, end_line, len(lines.line(end_line)))
        for _, tok in self._tokens(_CONSTEXPR):
            qualifier = tok.parent
            decl = qualifier.parent if qualifier is not None else None
            if tok.type != "constexpr" or decl is None or decl.type != "declaration":
                continue
            type_text = _squash(_text(decl.child_by_field_name("type")))
            if any(h in type_text for h in _INTEGRAL_HINTS):
                continue
            for d in decl.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                ident, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
                if ident is None or value is None or ident.type != "identifier":
                    continue
                if value.type == "initializer_list":  # constexpr int N{4};
                    inner = value.named_children
                    if len(inner) != 1:
                        continue
                    value = inner[0]
                text = _squash(_text(value))
                int_value = eval_int(text, names)
                if int_value is None and type_text == "auto":
                    continue
                if int_value is not None:
                    names[_text(ident)] = int_value
                self.facts.constants.append(Constant(
                    name=_text(ident), type=type_text, value=text, int_value=int_value,
                    span=lines.span(d), name_span=lines.span(ident), value_span=lines.span(value),
                    function=_enclosing_function(decl)))

    def _byte_point(self, byte_pos: int) -> tuple[int, int]:
        line_start = self.tree_bytes.rfind(b"\n", 0, byte_pos) + 1
        return self.tree_bytes.count(b"\n", 0, byte_pos), byte_pos - line_start

    def resolve_numbers(self) -> None:
        """Integer values of launch bounds and block sizes, through macros, constants and
        template defaults (`__launch_bounds__(THREADS)` with `int THREADS = BLOCK_THREADS`)."""
        names: dict[str, int] = {}
        for d in self.facts.defines:
            if d.int_value is not None:
                names.setdefault(d.name, d.int_value)
        for c in self.facts.constants:
            if c.int_value is not None and c.function is None:
                names.setdefault(c.name, c.int_value)
        for k in self.facts.kernels:
            scope = dict(names)
            for p in k.data.get("template_params", []):
                if p.get("kind") == "value" and p.get("default"):
                    value = eval_int(p["default"], names)
                    if value is not None:
                        scope[p["name"]] = value
            k.data["launch_bounds_values"] = [eval_int(b, scope) for b in k.data.get("launch_bounds", [])]
        for launch in self.facts.launches:
            launch.block_threads = _threads(launch.block, names)

    # -- recovery -----------------------------------------------------------------------
    def recover_kernels(self) -> None:
        """With syntax errors, tree-sitter may swallow later kernels into an ERROR node; find
        `__global__` definitions the tree missed by scanning the text."""
        text = self.lines.text
        known = {(k.name_span.start_line, k.name_span.start_col) for k in self.facts.kernels}
        for byte_pos in self.missed_kernels:
            row, byte_col = self._byte_point(byte_pos)
            pos = self.lines.starts[row] + self.lines.col(row, byte_col)
            self._recover_one(text, pos, known)
        self.facts.kernels.sort(key=lambda k: (k.span.start_line, k.span.start_col))

    def _recover_one(self, text: str, pos: int, known: set[tuple[int, int]]) -> int:
        ident = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
        cursor = pos + len("__global__")
        while True:
            m = ident.search(text, cursor, min(len(text), pos + 400))
            if m is None:
                return cursor
            if m.group(1) != "__launch_bounds__":
                break
            close = text.find(")", m.end())
            if close == -1:
                return m.end()
            cursor = close + 1
        if re.search(r"[;{}]", text[pos:m.start()]):
            return m.start()
        name = m.group(1)
        open_paren = m.end() - 1
        depth, i = 0, open_paren
        while i < len(text):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        after = text[i + 1:i + 200].lstrip()
        if after.startswith(";"):
            return i
        name_pos = self.lines.position(m.start(1))
        if name_pos in known:
            return i
        params = []
        for part in text[open_paren + 1:i].split(","):
            part = _squash(part)
            if not part:
                continue
            words = re.findall(r"[A-Za-z_]\w*", part)
            pname = words[-1] if len(words) > 1 else ""
            params.append({"type": _squash(part[: part.rfind(pname)]) if pname else part, "name": pname})
        end = self.lines.position(min(i + 1, len(text)))
        start = self.lines.position(pos)
        self.facts.kernels.append(Target(
            name=name, kind=TargetKind.CUDA_KERNEL, path=self.path,
            span=Span(start[0], start[1], end[0], end[1]),
            name_span=Span(name_pos[0], name_pos[1], name_pos[0], name_pos[1] + len(name)),
            detail=_squash(text[pos:i + 1]),
            data={"template_params": [], "launch_bounds": [], "params": params, "recovered": True}))
        known.add(name_pos)
        return i


def read_cuda(tree, lines: LineIndex, path: str, language: Language, source: bytes) -> CudaFacts:
    reader = _Reader(tree, lines, path, language, source)
    reader.walk_declarations()
    reader.read_exports()
    reader.read_launches()
    reader.read_defines_and_constants()
    reader.resolve_numbers()
    if reader.missed_kernels:
        reader.recover_kernels()
    return reader.facts


def find_host_function(tree, lines: LineIndex, path: str, language: Language, source: bytes,
                       name: str) -> HostFunction | None:
    """The host function definition `name` in a parsed CUDA/C++ source, if there is one."""
    return _Reader(tree, lines, path, language, source).host_function(name)
