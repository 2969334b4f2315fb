"""load_inline's ``main.cpp`` bound by signature, not by name, so one object serves every file
whose bound functions have the same types.

``main.cpp`` is ``cpp_sources`` (in KernelBench-format files, declarations of the functions that
``cuda_sources`` defines) and a ``PYBIND11_MODULE`` that binds ``functions=``. It is the slowest
unit of a new file's build: 4.5-6.3 s of g++ on the H100 machine, and about as long with an empty
module body (the pybind and torch headers' own instantiations, not the functions', take the
time), so reusing its object across files is the only way to make it cheap. Its text here names
no function: each bound function is declared under a placeholder name (``klsp_bound_<i>``) with
the types as written, and ``m.def`` takes the Python name and docstring from two strings defined
in a small C object (``names_c``, milliseconds of cc). The link then points each placeholder at
the real function (``--defsym``: placeholder's mangled name = the real one's, the same types
after the same ``_Z<len><name>`` prefix). The extension that loads is the one load_inline would
have built: the same functions under the same names and docstrings, the same error handling.

Over the 430 ``load_inline`` calls with literal arguments in KernelBench's public leaderboard
solutions, all 430 bind this way, in 57 distinct texts; the eight most common signatures
(``COMMON``) serve 355 of them (83 %, ``benchmarks/results/binding_coverage.md``) and are built
ahead on machines with the cores for it (fastbuild.prebuild_bindings), so most new files' builds
do not wait for their binding at all.

Anything else (a definition, a namespace, an overload, a name that needs escaping) keeps the text
load_inline writes; so does any build whose binding fails to compile, to read or to link
(fastbuild falls back to it, and its errors are the ones the user sees).
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.engine.worker.build import inline_split

OFF_ENV = "KERNEL_LSP_SIGNATURE_BINDING"  # "0": main.cpp keeps load_inline's text
PLACEHOLDER = "klsp_bound_"
NAME_SYM = "klsp_bound_name_"
DOC_SYM = "klsp_bound_doc_"
_HIDDEN = '__attribute__((visibility("hidden")))'
# Words that end a parameter's type, never name the parameter ("unsigned int", "long long").
_TYPE_WORDS = frozenset({"int", "long", "short", "char", "float", "double", "bool", "unsigned", "signed", "void",
                         "const", "volatile", "auto", "wchar_t", "char16_t", "char32_t"})
# Declarations with these are not plain global functions: the text load_inline writes is kept.
_NOT_PLAIN = frozenset({"template", "namespace", "using", "typedef", "extern", "static", "inline", "struct", "class",
                        "union", "enum", "operator", "friend", "virtual", "constexpr", "decltype", "noexcept",
                        "throw", "__attribute__", "__declspec", "asm", "__asm__", "typename"})
_SAFE_TEXT = re.compile(r"[A-Za-z0-9_ .,:;()\[\]<>+\-*/=!?'%&|^~@#$]*")

# The leaderboard's most common signatures (return type, parameter types), most common first:
# 129, 115, 35, 23, 22, 12, 12 and 7 of 430 calls (benchmarks/binding_coverage.py).
COMMON: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch::Tensor", ("torch::Tensor",)),
    ("torch::Tensor", ("torch::Tensor", "torch::Tensor")),
    ("torch::Tensor", ("torch::Tensor", "float")),
    ("torch::Tensor", ("torch::Tensor", "float", "float")),
    ("torch::Tensor", ("torch::Tensor", "int")),
    ("torch::Tensor", ("torch::Tensor", "torch::Tensor", "torch::Tensor")),
    ("torch::Tensor", ("torch::Tensor", "torch::Tensor", "float")),
    ("torch::Tensor", ("torch::Tensor", "int", "int", "int")),
)


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "").strip() != "0"


@dataclass(frozen=True)
class Binding:
    """What main.cpp binds: per function (in ``functions=`` order) its Python name, docstring and
    the types of its C++ declaration; ``includes``: cpp_sources' #include lines, as written."""

    functions: tuple[tuple[str, str, str, tuple[str, ...]], ...]  # (name, doc, return type, parameter types)
    includes: tuple[str, ...] = ()
    implicit_header: bool = True          # load_inline's `#include <torch/extension.h>` first
    wrapped: bool = True                  # with_pytorch_error_handling

    def text(self) -> str:
        """main.cpp by signature: no function's name in it (the object's key is its types)."""
        lines = ["#include <torch/extension.h>"] if self.implicit_header else []
        lines += list(self.includes)
        defs = []
        for i, (_, _, ret, params) in enumerate(self.functions):
            lines.append(f"{_HIDDEN} {ret} {PLACEHOLDER}{i}({', '.join(params)});")
            lines.append(f'extern "C" {_HIDDEN} const char {NAME_SYM}{i}[], {DOC_SYM}{i}[];')
            fn = f"torch::wrap_pybind_function({PLACEHOLDER}{i})" if self.wrapped else f"{PLACEHOLDER}{i}"
            defs.append(f"m.def(static_cast<const char *>({NAME_SYM}{i}), {fn}, "
                        f"static_cast<const char *>({DOC_SYM}{i}));")
        return "\n".join([*lines, "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {", *defs, "}"])

    def names_c(self) -> str:
        """The C source of the names and docstrings m.def reads."""
        out = []
        for i, (name, doc, _, _) in enumerate(self.functions):
            out.append(f'{_HIDDEN} const char {NAME_SYM}{i}[] = "{name}";')
            out.append(f'{_HIDDEN} const char {DOC_SYM}{i}[] = "{doc}";')
        return "\n".join(out) + "\n"


def of(args: dict[str, Any]) -> tuple[Binding | None, str]:
    """(the binding of load_inline's bound ``args``, "") or (None, why main.cpp keeps its text)."""
    functions = args.get("functions")
    if functions is None:
        return None, "no functions= to bind"
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, (list, tuple)):
        functions = {str(f): str(f) for f in functions}
    if not isinstance(functions, dict) or not functions:
        return None, "functions= is neither a name, a list nor a dict"
    for name, doc in functions.items():
        if not re.fullmatch(r"[A-Za-z_]\w*", str(name)) or not _SAFE_TEXT.fullmatch(str(doc)):
            return None, f"function {name!r} or its docstring is not plain text"
    cpp = args.get("cpp_sources") or []
    text = "\n".join([cpp] if isinstance(cpp, str) else [str(x) for x in cpp])
    try:
        toks = inline_split.lex(text)
    except inline_split.LexError as exc:
        return None, f"cpp_sources: {exc}"
    includes, decls, current = [], [], []
    for t in toks:
        if t.kind in ("ws", "nl", "comment"):
            continue
        if t.kind == "pp":
            if not re.match(r"#\s*include\s*[<\"]", t.text) or current:
                return None, f"cpp_sources has {t.text.split()[0]!r} lines"
            includes.append(t.text.strip())
        elif t.text in ("{", "}"):
            return None, "cpp_sources is not only plain function declarations (it has a body)"
        elif t.text == ";":
            if current:
                decls.append(current)
            current = []
        else:
            current.append(t)
    if current:
        return None, "cpp_sources ends without ';'"
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for d in decls:
        got = _declaration(d)
        if got is None:
            return None, "cpp_sources is not only plain function declarations"
        name, ret, params = got
        if name in found:
            return None, f"{name} is declared twice (an overload)"
        found[name] = (ret, params)
    missing = [f for f in functions if f not in found]
    if missing:
        return None, f"{missing[0]} is not declared in cpp_sources"
    return Binding(functions=tuple((str(n), str(d), *found[str(n)]) for n, d in functions.items()),
                   includes=tuple(includes), implicit_header=not args.get("no_implicit_headers"),
                   wrapped=bool(args.get("with_pytorch_error_handling", True))), ""


def _declaration(toks: list[inline_split.Tok]) -> tuple[str, str, tuple[str, ...]] | None:
    """(name, return type, parameter types) of `ret name(params)`, or None for anything else."""
    if any(t.text in _NOT_PLAIN or t.text in "{}" or t.kind in ("str", "chr") for t in toks):
        return None
    try:
        open_at = next(i for i, t in enumerate(toks) if t.text == "(")
    except StopIteration:
        return None
    if open_at < 2 or toks[-1].text != ")" or toks[open_at - 1].kind != "ident":
        return None
    if toks[open_at - 2].text == "::":  # a member or a namespaced function
        return None
    name = toks[open_at - 1].text
    ret = _joined(toks[:open_at - 1])
    inner = toks[open_at + 1:-1]
    if any(t.text in "()[]" for t in inner):  # function pointers, arrays: not for this
        return None
    params: list[str] = []
    for p in _split_commas(inner):
        p = p[:next((i for i, t in enumerate(p) if t.text == "="), len(p))]  # a default: pybind never sees it
        if not p:
            return None
        if len(p) >= 2 and p[-1].kind == "ident" and p[-1].text not in _TYPE_WORDS and p[-2].text != "::":
            p = p[:-1]  # the parameter's name
        params.append(_joined(p))
    if params == ["void"]:
        params = []
    return name, ret, tuple(params)


def _split_commas(toks: list[inline_split.Tok]) -> list[list[inline_split.Tok]]:
    out: list[list[inline_split.Tok]] = [[]]
    depth = 0
    for t in toks:
        if t.text == "<":
            depth += 1
        elif t.text in (">", ">>"):
            depth -= len(t.text)
        if t.text == "," and depth == 0:
            out.append([])
        else:
            out[-1].append(t)
    return [] if out == [[]] else out


def _joined(toks: list[inline_split.Tok]) -> str:
    """Tokens as one canonical text (spaces only where two words meet)."""
    out = ""
    for t in toks:
        if out and (out[-1].isalnum() or out[-1] == "_") and (t.text[0].isalnum() or t.text[0] == "_"):
            out += " "
        out += t.text
    return out


def literal_calls(text: str) -> list[dict[str, Any] | None]:
    """Each ``load_inline(...)`` call of a Python source, read without running it: its keyword
    arguments that are literals or module-level names bound to literals (anything else ``...``);
    None for a call whose ``cpp_sources`` or ``functions`` is not known so. [] when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            consts.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    out: list[dict[str, Any] | None] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "load_inline"):
            continue
        kw: dict[str, Any] = {}
        for k in node.keywords:
            try:
                kw[str(k.arg)] = ast.literal_eval(k.value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                kw[str(k.arg)] = consts.get(k.value.id, ...) if isinstance(k.value, ast.Name) else ...
        out.append(None if kw.get("cpp_sources", "") is ... or kw.get("functions") is ... else kw)
    return out


# -- the link ------------------------------------------------------------------------------------


_MANGLED: dict[str, dict[int, str]] = {}  # by the object's sha256: a body edit reuses main.cpp's object


def placeholders(obj: Path, timeout: float = 60.0) -> dict[int, str] | str:
    """{i: the mangled name of placeholder i} that the binding object refers to, or why not."""
    try:
        digest = hashlib.sha256(obj.read_bytes()).hexdigest()
    except OSError as exc:
        return f"the binding object: {exc}"
    if digest in _MANGLED:
        return dict(_MANGLED[digest])
    try:
        proc = subprocess.run(["nm", "-u", "--format=posix", str(obj)], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nm: {exc}"
    if proc.returncode != 0:
        return f"nm: {proc.stderr.strip()[:200]}"
    found: dict[int, str] = {}
    for line in proc.stdout.splitlines():
        sym = line.split(" ", 1)[0]
        m = re.match(rf"_Z(\d+){PLACEHOLDER}(\d+)", sym)
        if m and int(m.group(1)) == len(PLACEHOLDER) + len(m.group(2)):
            found[int(m.group(2))] = sym
    if len(_MANGLED) > 64:
        _MANGLED.clear()
    _MANGLED[digest] = dict(found)
    return found


def link_flags(b: Binding, mangled: dict[int, str]) -> list[str] | str:
    """The linker flags that point each placeholder at its function, or why not."""
    flags = []
    for i, (name, _, _, _) in enumerate(b.functions):
        sym = mangled.get(i)
        if sym is None:
            return f"the binding object does not refer to function {i}"
        ph = f"{PLACEHOLDER}{i}"
        real = f"_Z{len(name)}{name}" + sym[len(f"_Z{len(ph)}{ph}"):]
        flags.append(f"-Wl,--defsym={sym}={real}")
    return flags


def start_names_object(c_text: str, cc: str, build_dir: Path) -> subprocess.Popen[str] | str:
    """Start compiling a binding's C source (``Binding.names_c``, table_binding.table_c) in
    build_dir (milliseconds, beside the units' compiles); finish_names_object says how it went.
    A string: why it could not start."""
    (build_dir / "fast_bind_names.c").write_text(c_text)
    try:
        return subprocess.Popen([cc, "-x", "c", "-c", "-fPIC", "fast_bind_names.c", "-o", "fast_bind_names.o"],
                                cwd=build_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        return f"{cc}: {exc}"


def finish_names_object(started: subprocess.Popen[str] | str, timeout: float = 60.0) -> str:
    """"" when the names object is made, else why not."""
    if isinstance(started, str):
        return started
    try:
        out, _ = started.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        started.kill()
        started.communicate()
        return f"names: ran past {timeout:g} s"
    return "" if started.returncode == 0 else f"names: {(out or '').strip()[:200]}"


# -- built ahead -----------------------------------------------------------------------------------

PREBUILD_ENV = "KERNEL_LSP_PREBUILT_BINDINGS"
PREBUILD_MIN_CPUS = 8


def prebuild_count() -> int:
    """How many of COMMON to build ahead: all of them from PREBUILD_MIN_CPUS cores (each is a g++
    of several seconds and most of a GB), none below, unless $KERNEL_LSP_PREBUILT_BINDINGS says."""
    raw = os.environ.get(PREBUILD_ENV, "").strip()
    if raw:
        try:
            return max(0, min(len(COMMON), int(raw)))
        except ValueError:
            return 0
    return len(COMMON) if (os.cpu_count() or 1) >= PREBUILD_MIN_CPUS else 0


def common(count: int) -> list[Binding]:
    """The first ``count`` COMMON signatures, each as the binding of one function."""
    return [Binding(functions=(("f", "f", ret, params),)) for ret, params in COMMON[:count]]
