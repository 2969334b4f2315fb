"""Split a load_inline CUDA source into a device unit and a host unit (stdlib only).

nvcc spends about 50 s of a KernelBench candidate's build parsing torch's headers three times
(cudafe++, cicc, the host compiler) for kernels that use none of them. ``split`` cuts the source
into:

- the *device unit*: kernels, ``__device__`` code, the types, macros and constants they need,
  light CUDA headers only, and one generated launcher per kernel
  (``__klsp_launch_<kernel>(grid, block, shared_bytes, stream, <the kernel's parameters>)``)
  placed right after the kernel, in its namespace; nvcc builds it in about a second;
- the *host unit*: everything torch-facing, each kernel replaced by its launcher's declaration
  and each ``kernel<<<g, b, s, st>>>(args)`` by ``__klsp_launch_kernel(g, b, s, st, args)``;
  the host compiler builds it against a precompiled torch header.

Both units keep every line of the user's source on the same line (what goes to the other unit
is blanked, generated text is added on existing lines), so compiler messages keep their lines.
A launcher copies its kernel's parameter list, so the host's arguments convert exactly as they
did at the launch. A template kernel's launcher is a template; the device unit instantiates it
for the template arguments seen at the launches (``scalar_t`` inside ``AT_DISPATCH_*`` becomes
each dispatched type).

Where the source cannot be split safely the result has ``fallback_reason`` set and the caller
builds the normal way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# -- lexer ----------------------------------------------------------------------------------------

_KEYWORD_TYPES = {
    "int", "float", "double", "char", "bool", "void", "long", "short", "unsigned", "signed",
    "auto", "const", "volatile", "size_t", "half", "__half", "__nv_bfloat16", "dim3",
}


@dataclass
class Tok:
    kind: str   # ws nl comment pp str chr ident num punct
    text: str
    start: int
    end: int


_PUNCT3 = ("<<<", ">>>", "<<=", ">>=", "...", "->*")
_PUNCT2 = ("::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=",
           "/=", "%=", "&=", "|=", "^=", "##")


class LexError(ValueError):
    pass


def lex(src: str) -> list[Tok]:
    """C++ tokens with comments, strings (raw ones too) and whole preprocessor lines."""
    toks: list[Tok] = []
    i, n = 0, len(src)
    line_start = True
    open_launch = 0
    while i < n:
        c = src[i]
        if c == "\n":
            toks.append(Tok("nl", c, i, i + 1))
            i += 1
            line_start = True
            continue
        if c in " \t\r\f\v":
            j = i
            while j < n and src[j] in " \t\r\f\v":
                j += 1
            toks.append(Tok("ws", src[i:j], i, j))
            i = j
            continue
        if c == "\\" and i + 1 < n and src[i + 1] == "\n":  # a continued line outside a directive
            toks.append(Tok("ws", src[i:i + 2], i, i + 2))
            i += 2
            continue
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            toks.append(Tok("comment", src[i:j], i, j))
            i = j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise LexError("unterminated comment")
            toks.append(Tok("comment", src[i:j + 2], i, j + 2))
            i = j + 2
            continue
        if c == "#" and line_start:
            j = i
            while j < n:
                if src[j] == "\\" and j + 1 < n and src[j + 1] == "\n":
                    j += 2
                    continue
                if src.startswith("/*", j):  # a comment may hide a newline
                    k = src.find("*/", j + 2)
                    if k < 0:
                        raise LexError("unterminated comment")
                    j = k + 2
                    continue
                if src.startswith("//", j) or src[j] == "\n":
                    break
                j += 1
            while j < n and src[j] != "\n":  # a trailing // comment belongs to the line
                j += 1
            toks.append(Tok("pp", src[i:j], i, j))
            i = j
            continue
        line_start = False
        m = re.match(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(', src[i:i + 40])
        if m:
            close = ")" + m.group(1) + '"'
            j = src.find(close, i + m.end())
            if j < 0:
                raise LexError("unterminated raw string")
            toks.append(Tok("str", src[i:j + len(close)], i, j + len(close)))
            i = j + len(close)
            continue
        m = re.match(r"(?:u8|u|U|L)?(['\"])", src[i:i + 3])
        if m and (m.start(1) == 0 or not (toks and toks[-1].kind == "ident" and toks[-1].end == i)):
            q = m.group(1)
            j = i + m.end()
            while j < n and src[j] != q:
                if src[j] == "\\":
                    j += 1
                elif src[j] == "\n":
                    raise LexError("newline in a string literal")
                j += 1
            if j >= n:
                raise LexError("unterminated string")
            toks.append(Tok("str" if q == '"' else "chr", src[i:j + 1], i, j + 1))
            i = j + 1
            continue
        if c.isalpha() or c == "_":
            m = re.compile(r"[A-Za-z_]\w*").match(src, i)
            assert m
            toks.append(Tok("ident", m.group(0), i, m.end()))
            i = m.end()
            continue
        if c.isdigit() or (c == "." and i + 1 < n and src[i + 1].isdigit()):
            m = re.compile(r"(?:0[xX][0-9a-fA-F']+|[0-9][0-9']*\.?[0-9']*|\.[0-9']+)(?:[eEpP][+-]?\d+)?\w*").match(src, i)
            assert m
            toks.append(Tok("num", m.group(0), i, m.end()))
            i = m.end()
            continue
        for p in _PUNCT3:
            if src.startswith(p, i):
                if p == ">>>" and not open_launch:
                    continue
                open_launch += {"<<<": 1, ">>>": -1}.get(p, 0)
                toks.append(Tok("punct", p, i, i + 3))
                i += 3
                break
        else:
            two = src[i:i + 2]
            if two in _PUNCT2 and not (two == ">>" and open_launch == 0 and False):
                toks.append(Tok("punct", two, i, i + 2))
                i += 2
            else:
                toks.append(Tok("punct", c, i, i + 1))
                i += 1
    return toks


def _code(toks: list[Tok]) -> list[Tok]:
    return [t for t in toks if t.kind not in ("ws", "nl", "comment")]


# -- top-level items ------------------------------------------------------------------------------


@dataclass
class Item:
    kind: str                # pp, decl, ns_open, ns_close
    start: int
    end: int
    toks: list[Tok]          # code tokens only
    ns: tuple[str, ...]      # enclosing namespaces ("" for an anonymous one)
    unit: str = ""           # device, host, both
    kernel: "Kernel | None" = None


@dataclass
class Kernel:
    name: str
    ns: tuple[str, ...]
    template: str            # "template <typename T, int N>" or ""
    tparams: list[str]       # template parameter names
    ttypes: list[bool]       # which template parameters are types
    params: str              # the parameter list text, without parentheses
    pnames: list[str]
    is_definition: bool
    item: Item | None = None


def _items(src: str, toks: list[Tok]) -> list[Item]:
    """Top-level declarations; namespaces and extern "C" blocks open and close around theirs."""
    items: list[Item] = []
    ns: list[str] = []
    code = [t for t in toks if t.kind not in ("ws", "nl", "comment")]
    i = 0
    n = len(code)
    while i < n:
        t = code[i]
        if t.kind == "pp":
            items.append(Item("pp", t.start, t.end, [t], tuple(ns)))
            i += 1
            continue
        if t.text == "}" and ns:
            items.append(Item("ns_close", t.start, t.end, [t], tuple(ns)))
            ns.pop()
            i += 1
            if i < n and code[i].text == ";":
                i += 1
            continue
        if t.text == ";":
            i += 1
            continue
        # namespace a::b { / namespace { / extern "C" {
        j = i
        if t.text in ("namespace", "inline") and (t.text == "namespace" or (i + 1 < n and code[i + 1].text == "namespace")):
            j = i + (2 if t.text == "inline" else 1)
            names = []
            while j < n and (code[j].kind == "ident" or code[j].text == "::"):
                if code[j].kind == "ident":
                    names.append(code[j].text)
                j += 1
            if j < n and code[j].text == "{":
                items.append(Item("ns_open", t.start, code[j].end, code[i:j + 1], tuple(ns)))
                ns.append("::".join(names))
                i = j + 1
                continue
            if j < n and code[j].text == "=":  # namespace alias
                pass
        if t.text == "extern" and i + 2 < n and code[i + 1].kind == "str" and code[i + 2].text == "{":
            items.append(Item("ns_open", t.start, code[i + 2].end, code[i:i + 3], tuple(ns)))
            ns.append("extern")
            i += 3
            continue
        # one declaration: up to ';' at depth 0, or a function body's closing brace
        depth = 0
        j = i
        saw_eq = False
        head_kw = t.text in ("struct", "class", "union", "enum", "typedef", "using")
        if t.text == "template" and i + 1 < n and code[i + 1].text == "<":
            close = _match(code, i + 1, "<", ">")
            head_kw = close + 1 < n and code[close + 1].text in ("struct", "class", "union")
        while j < n:
            x = code[j]
            if x.kind == "pp":
                if depth == 0:
                    break  # a directive between declarations' tokens: end here
                j += 1
                continue
            if x.text in ("(", "[", "{"):
                depth += 1
            elif x.text in (")", "]", "}"):
                depth -= 1
                if depth < 0:
                    raise LexError("unbalanced brackets")
                if depth == 0 and x.text == "}" and not saw_eq and not head_kw:
                    j += 1
                    break
            elif x.text == "=" and depth == 0:
                saw_eq = True
            elif x.text == ";" and depth == 0:
                j += 1
                break
            j += 1
        else:
            if depth:
                raise LexError("unbalanced brackets at the end")
        if j == i:
            j = i + 1
        items.append(Item("decl", code[i].start, code[j - 1].end, code[i:j], tuple(ns)))
        i = j
    if ns:
        raise LexError("unclosed namespace")
    return items


# -- classification -------------------------------------------------------------------------------

_TORCH_IDENTS = {"torch", "at", "c10", "Tensor", "pybind11", "py", "PYBIND11_MODULE", "TORCH_LIBRARY",
                 "TORCH_CHECK", "TORCH_INTERNAL_ASSERT", "C10_CUDA_CHECK", "C10_CUDA_KERNEL_LAUNCH_CHECK"}
_TORCH_PREFIX = re.compile(r"^(AT_|TORCH_|C10_)")
_HOST_INCLUDE = re.compile(r"^(torch|ATen|c10|pybind11|THC|caffe2)/")
_DEVICE_INCLUDE = re.compile(r"^(cub|thrust|cooperative_groups|mma\.h|cuda/|cuda_pipeline|cuda_awbarrier|cute|cutlass|"
                             r"sm_\d+_intrinsics|crt/)")
_DEVICE_KEYWORDS = {"__global__", "__device__", "__constant__", "__shared__", "__managed__"}
_HALF_OK = {"Half", "BFloat16"}
_DEVICE_TORCH_INCLUDE = {"Half": "c10/util/Half.h", "BFloat16": "c10/util/BFloat16.h"}

DISPATCH_TYPES = {
    "Float": "float", "Double": "double", "Half": "c10::Half", "BFloat16": "c10::BFloat16",
    "Byte": "uint8_t", "Char": "int8_t", "Short": "int16_t", "Int": "int", "Long": "int64_t", "Bool": "bool",
}
_DISPATCH_BASE = {
    "AT_DISPATCH_FLOATING_TYPES": ["Double", "Float"],
    "AT_DISPATCH_FLOATING_TYPES_AND_HALF": ["Double", "Float", "Half"],
    "AT_DISPATCH_REDUCED_FLOATING_TYPES": ["Half", "BFloat16"],
    "AT_DISPATCH_INTEGRAL_TYPES": ["Byte", "Char", "Int", "Long", "Short"],
    "AT_DISPATCH_ALL_TYPES": ["Byte", "Char", "Double", "Float", "Int", "Long", "Short"],
}


@dataclass
class Launch:
    kernel: str
    targs: str               # explicit template arguments text ("" when none)
    config: list[str]
    line: int
    dispatch: list[str]      # C++ types scalar_t takes at this launch ([] outside AT_DISPATCH_*)


@dataclass
class Split:
    """What goes to which unit; ``fallback_reason`` set when the source cannot be split safely."""

    device: str = ""
    device_full: str = ""   # `device` with the full prelude (the same text when it has it)
    host: str = ""
    kernels: list[Kernel] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    launchers: list[str] = field(default_factory=list)      # generated launcher definitions
    instantiations: list[str] = field(default_factory=list)
    device_items: list[str] = field(default_factory=list)   # first line of each device-only item
    host_items: list[str] = field(default_factory=list)
    both_items: list[str] = field(default_factory=list)
    fallback_reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.fallback_reason


class Fallback(Exception):
    pass


def _line_of(src: str, pos: int) -> int:
    return src.count("\n", 0, pos) + 1


def _first_line(src: str, item: Item) -> str:
    text = src[item.start:item.end].strip().splitlines()
    return text[0][:80] if text else ""


def _classify(src: str, item: Item) -> str:
    if item.kind in ("ns_open", "ns_close"):
        return "both"
    if item.kind == "pp":
        m = re.match(r"#\s*include\s*([<\"])([^>\"]+)[>\"]", item.toks[0].text)
        if m:
            if m.group(1) == '"':
                raise Fallback(f"includes a local header \"{m.group(2)}\" (line {_line_of(src, item.start)})")
            path = m.group(2).strip()
            if _HOST_INCLUDE.match(path):
                return "host"
            if _DEVICE_INCLUDE.match(path):
                return "device"
        return "both"
    texts = [t.text for t in item.toks]
    brace = texts.index("{") if "{" in texts else len(texts)
    head_idents = {t.text for t in item.toks[:brace] if t.kind == "ident"}
    body_idents = {t.text for t in item.toks[brace:] if t.kind == "ident"}
    if "__global__" in head_idents:
        return "kernel"
    # A top-level __host__ __device__ function: the device unit has it; the host may not use it.
    if head_idents & _DEVICE_KEYWORDS:
        return "device"
    if body_idents & (_DEVICE_KEYWORDS - {"__shared__"}) and not (head_idents & {"struct", "class", "union"}):
        raise Fallback(f"device code in host code (a __device__ lambda?) at line {_line_of(src, item.start)}")
    if _mentions_torch(item):
        return "host"
    # Neutral: types, constants, macros' users. A plain non-constexpr function or a mutable
    # variable belongs to the host (the device could not use it in the full build either).
    head = texts[:brace]
    is_function = "(" in head and "=" not in head and head[0] not in ("struct", "class", "union", "enum", "typedef", "using")
    if head and head[0] == "template" and any(k in head for k in ("struct", "class", "union")) and "(" not in head[:3]:
        is_function = False
    if is_function:
        return "both" if "constexpr" in head else "host"
    if head and head[0] in ("struct", "class", "union", "enum", "typedef", "using", "template", "static_assert"):
        return "both"
    if "constexpr" in head or "const" in head:
        return "both"
    return "host"


def _mentions_torch(item: Item) -> bool:
    for k, t in enumerate(item.toks):
        if t.kind != "ident":
            continue
        if t.text in ("at", "c10") and k + 2 < len(item.toks) and item.toks[k + 1].text == "::" \
                and item.toks[k + 2].text in _HALF_OK:
            continue  # at::Half / c10::BFloat16 work in the device unit with c10's light header
        if t.text in _TORCH_IDENTS or _TORCH_PREFIX.match(t.text):
            return True
    return False


def _split_commas(toks: list[Tok], angle: bool = False) -> list[list[Tok]]:
    parts: list[list[Tok]] = [[]]
    depth = 0
    for t in toks:
        if t.text in ("(", "[", "{") or (angle and t.text == "<"):
            depth += 1
        elif t.text in (")", "]", "}") or (angle and t.text == ">"):
            depth -= 1
        elif angle and t.text == ">>":
            depth -= 2
        if t.text == "," and depth == 0:
            parts.append([])
        else:
            parts[-1].append(t)
    return parts if parts != [[]] else []


def _match(toks: list[Tok], i: int, open_: str, close: str) -> int:
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text == open_:
            depth += 1
        elif toks[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    raise Fallback(f"unbalanced '{open_}'")


def _kernel(src: str, item: Item) -> Kernel:
    toks = item.toks
    template = ""
    tparams: list[str] = []
    ttypes: list[bool] = []
    k = 0
    if toks[0].text == "template":
        end = _match(toks, 1, "<", ">")
        template = src[toks[0].start:toks[end].end]
        for part in _split_commas(toks[2:end], angle=True):
            words = [t.text for t in part if t.kind == "ident"]
            if "..." in [t.text for t in part]:
                raise Fallback("a kernel template with a parameter pack")
            eq = [t.text for t in part].index("=") if "=" in [t.text for t in part] else len(part)
            names = [t.text for t in part[:eq] if t.kind == "ident"]
            if not names:
                raise Fallback("a kernel template parameter without a name")
            tparams.append(names[-1])
            ttypes.append(bool(words) and words[0] in ("typename", "class"))
        k = end + 1
    # the name is the identifier before the parameter list's '('
    paren = next((j for j in range(k, len(toks)) if toks[j].text == "("
                  and toks[j - 1].kind == "ident" and toks[j - 1].text not in ("__launch_bounds__", "__attribute__",
                                                                               "__align__", "alignas", "__declspec")),
                 None)
    if paren is None:
        raise Fallback(f"cannot read the kernel at line {_line_of(src, item.start)}")
    name = toks[paren - 1].text
    close = _match(toks, paren, "(", ")")
    ptoks = toks[paren + 1:close]
    params = " ".join(t.text for t in ptoks)  # no comments: the launcher sits on one line
    pnames: list[str] = []
    for part in _split_commas(ptoks, angle=True):
        texts = [t.text for t in part]
        if texts == ["void"]:
            continue
        if "=" in texts:
            part = part[:texts.index("=")]
        while part and part[-1].text == "]":
            part = part[:[t.text for t in part].index("[")]
        if not part or part[-1].kind != "ident" or part[-1].text in _KEYWORD_TYPES or len(part) < 2:
            raise Fallback(f"kernel {name} has a parameter without a name")
        pnames.append(part[-1].text)
    body = close + 1 < len(toks) and any(t.text == "{" for t in toks[close + 1:])
    return Kernel(name, item.ns, template, tparams, ttypes, params, pnames, body, item)


def _dispatch_types(macro: str, args: list[list[Tok]]) -> list[str]:
    base = macro
    extra: list[str] = []
    m = re.fullmatch(r"(AT_DISPATCH_\w+?)_AND(\d*)", macro)
    if m and m.group(1) in _DISPATCH_BASE:
        base = m.group(1)
        count = int(m.group(2) or 1)
        for part in args[:count]:
            names = [re.sub(r"^k(?=[A-Z])", "", t.text) for t in part if t.kind == "ident"]  # at::kHalf
            if not names or names[-1] not in DISPATCH_TYPES:
                raise Fallback(f"{macro} with an extra type this splitter does not know")
            extra.append(names[-1])
    if base not in _DISPATCH_BASE:
        raise Fallback(f"{macro} is not a dispatch macro this splitter knows")
    return [DISPATCH_TYPES[x] for x in _DISPATCH_BASE[base] + extra]


def _launches(src: str, item: Item, kernels: dict[str, list[Kernel]]) -> list[tuple[int, int, str, Launch]]:
    """(start, end, replacement, Launch) for each kernel<<<...>>>( in a host item."""
    toks = item.toks
    out = []
    # dispatch regions: AT_DISPATCH_*(type, name, lambda) spans with their types
    regions: list[tuple[int, int, list[str]]] = []
    for k, t in enumerate(toks):
        if t.kind == "ident" and t.text.startswith("AT_DISPATCH") and k + 1 < len(toks) and toks[k + 1].text == "(":
            close = _match(toks, k + 1, "(", ")")
            args = _split_commas(toks[k + 2:close])
            types = _dispatch_types(t.text, args)  # the _AND<n> variants name their extra types first
            regions.append((t.start, toks[close].end, types))
    for k, t in enumerate(toks):
        if t.text != "<<<":
            continue
        close = next((j for j in range(k + 1, len(toks)) if toks[j].text == ">>>"), None)
        if close is None or close + 1 >= len(toks) or toks[close + 1].text != "(":
            raise Fallback(f"cannot read the launch at line {_line_of(src, t.start)}")
        # the callee: name [<targs>] possibly qualified
        j = k - 1
        targs = ""
        if toks[j].text in (">", ">>"):
            depth = 0
            m = j
            while m >= 0:
                depth += {">": 1, ">>": 2, "<": -1}.get(toks[m].text, 0)
                if depth <= 0:
                    break
                m -= 1
            if m < 0:
                raise Fallback(f"cannot read the launch at line {_line_of(src, t.start)}")
            targs = src[toks[m + 1].start:toks[j].start] if m + 1 < j else ""
            if toks[j].text == ">>":
                raise Fallback(f"nested template arguments at the launch at line {_line_of(src, t.start)}")
            j = m - 1
        if j < 0 or toks[j].kind != "ident":
            raise Fallback(f"a launch through an expression at line {_line_of(src, t.start)}")
        name = toks[j].text
        if name not in kernels:
            raise Fallback(f"a launch of {name}, which is not a kernel of this source (line {_line_of(src, t.start)})")
        config_parts = _split_commas(toks[k + 1:close])
        if not 2 <= len(config_parts) <= 4 or any(not p for p in config_parts):
            raise Fallback(f"a launch configuration this splitter cannot read (line {_line_of(src, t.start)})")
        config = [src[p[0].start:p[-1].end] for p in config_parts]
        dispatch = [types for (a, b, types) in regions if a <= t.start < b]
        launch = Launch(name, targs.strip(), config, _line_of(src, t.start), dispatch[-1] if dispatch else [])
        # replacement keeps the newlines of what it replaces
        paren = toks[close + 1]
        args_empty = close + 2 < len(toks) and toks[close + 2].text == ")"
        filled = list(config) + ["0"] * (4 - len(config))
        new = f"__klsp_launch_{name}" + (f"<{targs}>" if targs else "") + "(" + ", ".join(filled) + ("" if args_empty else ", ")
        old = src[toks[j].start:paren.end]
        lost = old.count("\n") - new.count("\n")
        new += "\n" * max(lost, 0)
        out.append((toks[j].start, paren.end, new, launch))
    return out


def _instances(kernel: Kernel, launches: list[Launch]) -> list[str]:
    """Template argument lists to instantiate a template kernel's launcher with."""
    out: list[str] = []
    for launch in launches:
        if launch.targs:
            args = [launch.targs]
        elif len(kernel.tparams) == 1 and kernel.ttypes[0] and launch.dispatch:
            args = ["scalar_t"]  # deduced from data_ptr<scalar_t>() inside the dispatch
        else:
            raise Fallback(f"template kernel {kernel.name} launched without template arguments")
        for a in args:
            if re.search(r"\bscalar_t\b", a):
                if not launch.dispatch:
                    raise Fallback(f"scalar_t outside AT_DISPATCH at the launch of {kernel.name}")
                for ty in launch.dispatch:
                    out.append(re.sub(r"\bscalar_t\b", ty, a))
            else:
                out.append(a)
    seen: list[str] = []
    for a in out:
        if a not in seen:
            seen.append(a)
    return seen


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


DEVICE_PRELUDE = (
    "#include <cuda.h>\n#include <cuda_runtime.h>\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
    "#include <cstdint>\n#include <cstddef>\n#include <cmath>\n#include <cfloat>\n#include <climits>\n"
    "#include <algorithm>\n#include <limits>\n#include <type_traits>\n#include <utility>\n"
)
# The same without cuda_fp16.h, cuda_bf16.h and <algorithm>: those three are 40 % of a small
# device unit's nvcc time (1.80 s -> 1.11 s for a GELU kernel, nvcc 13.0 on 2 cores), and most
# fp32 kernels use nothing of them. Chosen when the device code names nothing that looks like
# theirs (LIGHT_PRELUDE_MISS); a light unit that still fails to compile is compiled again with
# DEVICE_PRELUDE (fastbuild), so a wrong guess costs time, never a verdict.
DEVICE_PRELUDE_LIGHT = (
    "#include <cuda.h>\n#include <cuda_runtime.h>\n"
    "#include <cstdint>\n#include <cstddef>\n#include <cmath>\n#include <cfloat>\n#include <climits>\n"
    "#include <limits>\n#include <type_traits>\n#include <utility>\n"
)
# Names of the half, bfloat16 and <algorithm> headers: their types (__half, half2, __nv_bfloat16),
# intrinsics (__hadd, __float2half_rn, __floats2half2_rn, __low2float, h2exp, hsqrt), and std::.
# A user's own #include of them is kept either way; a false match (a variable named `head`) only
# costs today's time.
LIGHT_PRELUDE_MISS = re.compile(
    r"(?i:half|bf16|bfloat|fp16)|\b__nv_|\b__h(?!ost__)|\b__(?:float|floats|double|int|uint|short|ushort|ll|ull|"
    r"low|high|lows|highs|halves)2|\bh2?[a-z]{2,6}(?:2|10)?\b|\bstd\b")


def device_prelude(device_code: str) -> str:
    """The prelude a device unit's code needs: the light one unless its code may use more."""
    return DEVICE_PRELUDE if LIGHT_PRELUDE_MISS.search(device_code) else DEVICE_PRELUDE_LIGHT
HOST_PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"


def split(src: str, filename: str = "cuda.cu", anon_tag: str = "") -> Split:
    """Split ``src``; a Split with ``fallback_reason`` when that is not safe. ``anon_tag`` goes
    into the names given to anonymous namespaces (``__klsp_anon<tag><n>``): sources linked into
    one library need names of their own, or their launchers and helpers would merge."""
    result = Split()
    try:
        _split(src, filename, result, anon_tag)
    except (Fallback, LexError) as exc:
        result.fallback_reason = str(exc)
    return result


def _split(src: str, filename: str, out: Split, anon_tag: str = "") -> None:
    toks = lex(src)
    items = _items(src, toks)
    kernels: dict[str, list[Kernel]] = {}
    device_names: dict[str, str] = {}   # device-only names -> what they are
    for it in items:
        it.unit = _classify(src, it)
        if it.unit == "kernel":
            kern = _kernel(src, it)
            it.kernel = kern
            kernels.setdefault(kern.name, []).append(kern)
            out.kernels.append(kern)
        elif it.unit == "device":
            for t in it.toks:
                if t.text == "__constant__":
                    name = _declared_name(it)
                    if name:
                        device_names[name] = "__constant__"
                    break
            else:
                name = _declared_name(it)
                if name:
                    device_names[name] = "__device__"
    if not kernels:
        raise Fallback("no __global__ kernel in the CUDA source")
    for name, ks in kernels.items():
        if len(ks) > 1 and len({k.params for k in ks if k.is_definition}) > 1 and any(k.template for k in ks):
            raise Fallback(f"overloaded template kernel {name}")
    # host items: launches, and names that only the device unit has
    replacements: list[tuple[int, int, str]] = []
    half_needed: set[str] = set()
    for it in items:
        if it.unit not in ("host", "both") or it.kind != "decl":
            continue
        idents = [t for t in it.toks if t.kind == "ident"]
        texts = {t.text for t in idents}
        if "__device__" in texts or "__host__" in texts:
            raise Fallback(f"device code in host code (a __device__ lambda?) at line {_line_of(src, it.start)}")
        for bad in ("thrust", "cub", "cooperative_groups"):
            if bad in texts:
                raise Fallback(f"host code uses {bad} (line {_line_of(src, it.start)})")
        reps = _launches(src, it, kernels)
        starts = {s for (s, _, _, _) in reps}
        for t in idents:
            if t.text in device_names:
                raise Fallback(f"host code uses {device_names[t.text]} {t.text} (line {_line_of(src, t.start)})")
            if t.text in kernels and t.start not in starts:
                raise Fallback(f"host code refers to kernel {t.text} outside a launch (line {_line_of(src, t.start)})")
        for s, e, new, launch in reps:
            replacements.append((s, e, new))
            out.launches.append(launch)
            for ty in launch.dispatch:
                if ty.startswith("c10::"):
                    half_needed.add(ty[5:])
    # device code that names at::Half / c10::BFloat16 needs c10's header for it
    for it in items:
        if it.unit in ("kernel", "device", "both"):
            for t in it.toks:
                if t.text in _HALF_OK:
                    half_needed.add(t.text)
    # Build with per-character buffers: every unit keeps the user's line numbers.
    dev_chars = list(_blank(src))
    host_chars = list(src)
    anon_open: dict[int, int] = {}
    inst_lines: list[str] = []
    for it in items:
        seg = src[it.start:it.end]
        if it.kind == "ns_open":
            if it.toks[0].text in ("namespace", "inline") and not any(t.kind == "ident" and t.text not in ("namespace", "inline")
                                                                      for t in it.toks):
                anon_open[id(it)] = len(anon_open) + 1
                # A named namespace: the launcher declared in it must link across the units.
                seg = seg.replace("namespace", f"namespace __klsp_anon{anon_tag}{len(anon_open)}", 1)
            _set(dev_chars, it.start, it.end, seg)
            _set(host_chars, it.start, it.end, seg)
            continue
        if it.kind == "ns_close":
            opener = _opener(items, it)
            if opener is not None and id(opener) in anon_open:
                seg = seg + f" using namespace __klsp_anon{anon_tag}{anon_open[id(opener)]};"
            _set(dev_chars, it.start, it.end, seg)
            _set(host_chars, it.start, it.end, seg)
            continue
        first = _first_line(src, it)
        if it.unit == "kernel":
            kern = it.kernel
            assert kern is not None
            _set(dev_chars, it.start, it.end, seg)
            decl = _launcher_decl(kern)
            _set(host_chars, it.start, it.end, decl + ";" + "\n" * seg.count("\n"))
            if kern.is_definition:
                body = _launcher_def(kern)
                _set(dev_chars, it.start, it.end, seg + " " + body)
                out.launchers.append(body)
                if kern.template:
                    mine = [l for l in out.launches if l.kernel == kern.name]
                    for args in _instances(kern, mine):
                        q = "::".join(_qual(kern.ns) + [f"__klsp_launch_{kern.name}<{args}>"])
                        inst_lines.append(f"__attribute__((used)) static auto* __klsp_inst_{len(inst_lines)} = &::{q};")
            out.device_items.append(first)
        elif it.unit == "device":
            _set(dev_chars, it.start, it.end, seg)
            _set(host_chars, it.start, it.end, _blank(seg))
            out.device_items.append(first)
        elif it.unit == "host":
            _set(dev_chars, it.start, it.end, _blank(seg))
            out.host_items.append(first)
        else:
            _set(dev_chars, it.start, it.end, seg)
            out.both_items.append(first)
    for s, e, new in replacements:
        _set(host_chars, s, e, new)
    out.instantiations = inst_lines
    torch_heads = "".join(f"#include <{_DEVICE_TORCH_INCLUDE[h]}>\n" for h in sorted(half_needed))
    line = f'#line 1 "{filename}"\n'
    body = torch_heads + line + "".join(dev_chars) + "\n" + "\n".join(inst_lines) + "\n"
    out.device_full = DEVICE_PRELUDE + body
    out.device = device_prelude(body) + body
    out.host = HOST_PRELUDE + line + "".join(host_chars) + "\n"


def _opener(items: list[Item], close: Item) -> Item | None:
    depth = 0
    idx = items.index(close)
    for it in reversed(items[:idx]):
        if it.kind == "ns_close":
            depth += 1
        elif it.kind == "ns_open":
            if depth == 0:
                return it
            depth -= 1
    return None


def _set(buf: list[str], start: int, end: int, text: str) -> None:
    """Replace buf[start:end] (one character per slot) by text, keeping the slot count."""
    if end <= start:
        return
    buf[start] = text
    for k in range(start + 1, end):
        buf[k] = ""


def _qual(ns: tuple[str, ...]) -> list[str]:
    return [p for p in ns if p and p != "extern"]


def _declared_name(item: Item) -> str | None:
    texts = [t for t in item.toks]
    for k, t in enumerate(texts):
        if t.text in ("(", "=", ";", "[", "{") and k > 0 and texts[k - 1].kind == "ident":
            return texts[k - 1].text
    return None


def _launcher_decl(k: Kernel) -> str:
    head = (k.template + " ") if k.template else ""
    params = ("dim3 __klsp_grid, dim3 __klsp_block, size_t __klsp_shmem, cudaStream_t __klsp_stream"
              + (", " + k.params if k.params.strip() and k.params.strip() != "void" else ""))
    return f"{head}void __klsp_launch_{k.name}({' '.join(params.split())})"


def _launcher_def(k: Kernel) -> str:
    targs = f"<{', '.join(k.tparams)}>" if k.tparams else ""
    decl = " ".join(_launcher_decl(k).split("\n"))
    return (f"{decl} {{ {k.name}{targs}<<<__klsp_grid, __klsp_block, __klsp_shmem, __klsp_stream>>>"
            f"({', '.join(k.pnames)}); }}")
