"""The table binding: one ``main.cpp`` for every load_inline whose bound functions take and
return the types below, so a new file's first build compiles no binding at all.

A signature that no earlier build or the ahead builds made costs a main.cpp compile (4.5-7.5 s of
g++ on the H100 machine: issue 33's LayerNorm file spent 7.49 s there, its critical path), and
almost all of it is the pybind and torch headers, not the signature (binding.py). Here one text,
``MAIN``, serves every signature: its one ``m.def`` per function reads the function's address and
the codes of its types from a table in a small C object (``table_c``: milliseconds of cc),
converts the arguments with pybind's own casters (so it accepts and refuses what load_inline's
binding does), runs the call inside ``torch::wrap_pybind_function`` when load_inline would, and
calls the function by the x86-64 System V convention that g++ and nvcc's host compiler follow:
integers and pointers in order through six registers then the stack, floating point through
xmm0-7, a class with a destructor (``torch::Tensor``, ``std::vector``) passed as the address of a
copy the caller makes and destroys, and returned through a hidden first pointer.

The table names each function by its mangled name (``mangled``, checked against g++ for 282
signatures), so the link checks the declared types against the definition: a declaration that
the code does not define is an undefined symbol, and the build falls back to load_inline's text,
whose errors are the user's.

Differences from load_inline's module that a caller can see: ``f.__doc__`` starts with
``f(arg0: object, ...) -> object`` instead of the typed signature (the docstring itself is the
same), and a wrong call's TypeError has the same first line but lists the signature typed when
a type is refused, untyped when the count or a keyword is. A call costs 40-65 ns more on 2 cores
(benchmarks/binding_overhead.py; docs/fast-builds.md).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from kernel_lsp.engine.worker.build.binding import _HIDDEN, Binding

OFF_ENV = "KERNEL_LSP_TABLE_BINDING"  # "0": signatures are compiled one by one (binding.py)

PARAMS = {"torch::Tensor": "T", "at::Tensor": "T", "const torch::Tensor&": "R", "torch::Tensor const&": "R",
          "const at::Tensor&": "R", "at::Tensor const&": "R", "float": "f", "double": "d", "int": "i",
          "int64_t": "l", "std::int64_t": "l", "long": "l", "long int": "l", "bool": "b"}
RETURNS = {"torch::Tensor": "T", "at::Tensor": "T", "std::vector<torch::Tensor>": "V",
           "std::vector<at::Tensor>": "V", "void": "v", "float": "f", "double": "d", "int": "i",
           "int64_t": "l", "std::int64_t": "l", "long": "l", "bool": "b"}
INT_SLOTS = 16   # integer-class arguments MAIN passes (6 in registers, the rest on the stack)
SSE_SLOTS = 8    # floating-point arguments: registers only, so the stack holds integers alone
MAX_PARAMS = 16  # MAIN defines functions of 0 to MAX_PARAMS parameters (def_any)
_SRET = frozenset("TV")
SYM = "klsp_table"
# One row of the table, as both the C object and MAIN declare it (the two must agree).
ENTRY = "struct klsp_entry { const char *name, *doc; void *fn; const char *ret, *params; int wrapped; };"


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "").strip() != "0"


def _param_code(text: str) -> str | None:
    t = text
    # A top-level const on a value parameter is not part of the function's type.
    if t.startswith("const ") and not t.endswith("&"):
        t = t[len("const "):]
    return PARAMS.get(t)


def codes_of(b: Binding) -> tuple[list[tuple[str, str]], str]:
    """([(return code, parameter codes)] per function, "") or ([], why the table cannot call them)."""
    if platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        return [], f"the table binding calls by the x86-64 Linux convention, not {platform.machine()} {sys.platform}"
    out = []
    for name, _, ret, params in b.functions:
        r = RETURNS.get(ret)
        codes = [_param_code(p) for p in params]
        if r is None or None in codes:
            bad = ret if r is None else params[codes.index(None)]
            return [], f"{name}: the table binding has no {bad!r}"
        ints = sum(c in "TRilb" for c in codes) + (r in _SRET)
        if ints > INT_SLOTS or sum(c in "fd" for c in codes) > SSE_SLOTS or len(codes) > MAX_PARAMS:
            return [], f"{name}: more arguments than the table binding passes"
        out.append((r, "".join(codes)))  # type: ignore[arg-type]
    return out, ""


def mangled(name: str, codes: str) -> str:
    """The Itanium C++ name of ``name`` taking ``codes`` (a global function: the return type is not
    part of it). at::Tensor and its const reference take the standard's substitutions (S_, S0_, ...)."""
    subs: list[str] = []

    def sub(key: str) -> str | None:
        if key not in subs:
            return None
        i = subs.index(key)
        return "S_" if i == 0 else f"S{_base36(i - 1)}_"

    def tensor() -> str:
        got = sub("at::Tensor")
        if got:
            return got
        subs.extend(["at", "at::Tensor"])
        return "N2at6TensorE"

    out = []
    for c in codes:
        if c == "T":
            out.append(tensor())
        elif c == "R":
            got = sub("const at::Tensor&")
            if got is None:
                inner = tensor()
                subs.extend(["const at::Tensor", "const at::Tensor&"])
                got = "RK" + inner
            out.append(got)
        else:
            out.append(c)  # a scalar's code is its mangled letter (f, d, i, l, b)
    return f"_Z{len(name)}{name}{''.join(out) or 'v'}"


def _base36(n: int) -> str:
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


def table_c(b: Binding, codes: list[tuple[str, str]]) -> str:
    """The C source of the table MAIN reads: per function its Python name, docstring,
    address (by mangled name), codes and whether torch's error handling wraps it."""
    lines = [ENTRY]
    rows = []
    for (name, doc, _, _), (ret, params) in zip(b.functions, codes):
        sym = mangled(name, params)
        lines.append(f"extern void {sym}(void);")
        rows.append(f'  {{"{name}", "{doc}", (void *)&{sym}, "{ret}", "{params}", {int(b.wrapped)}}},')
    lines.append(f"{_HIDDEN} const struct klsp_entry {SYM}[] = {{")
    lines += rows
    lines.append("};")
    lines.append(f"{_HIDDEN} const int {SYM}_len = {len(rows)};")
    return "\n".join(lines) + "\n"


# The one main.cpp. Its object is kept like any unit's (unit_cache: keyed by text and flags, its
# PyInit renamed per extension), built ahead once per machine (fastbuild.start_prebuild).
MAIN = r"""// kernel-lsp's table binding (kernel_lsp/engine/worker/build/table_binding.py)
#define MAX_PARAMS @MAX_PARAMS@
#include <torch/extension.h>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <string>
#include <vector>

extern "C" {
@ENTRY@
__attribute__((visibility("hidden"))) extern const klsp_entry klsp_table[];
__attribute__((visibility("hidden"))) extern const int klsp_table_len;
}

namespace {
namespace py = pybind11;
using U = std::uint64_t;
using D = double;
// 16 integer-class arguments (6 in registers, 10 on the stack) and 8 floating-point ones (xmm0-7):
// a function that takes fewer reads only its own; the stack holds integers alone, in order.
#define KLSP_TYPES U, U, U, U, U, U, U, U, U, U, U, U, U, U, U, U, D, D, D, D, D, D, D, D
#define KLSP_ARGS a.i[0], a.i[1], a.i[2], a.i[3], a.i[4], a.i[5], a.i[6], a.i[7], a.i[8], a.i[9], \
  a.i[10], a.i[11], a.i[12], a.i[13], a.i[14], a.i[15], a.x[0], a.x[1], a.x[2], a.x[3], a.x[4], a.x[5], a.x[6], a.x[7]

struct Slots { U i[16] = {}; D x[8] = {}; int ni = 0, nx = 0; };

// Tensors made only for the arguments there are (no allocation, no 16 constructors per call).
struct Held {
  alignas(at::Tensor) unsigned char buf[16 * sizeof(at::Tensor)];
  size_t n = 0;
  at::Tensor *add(at::Tensor &&t) { return new (buf + n++ * sizeof(at::Tensor)) at::Tensor(std::move(t)); }
  ~Held() {
    for (size_t k = 0; k < n; ++k) std::launder(reinterpret_cast<at::Tensor *>(buf + k * sizeof(at::Tensor)))->~Tensor();
  }
};

const char *py_type(char c) {
  switch (c) {
    case 'T': case 'R': return "torch.Tensor";
    case 'f': case 'd': return "float";
    case 'i': case 'l': return "int";
    case 'b': return "bool";
    case 'v': return "None";
    case 'V': return "list[torch.Tensor]";
  }
  return "object";
}

[[noreturn]] void incompatible(const klsp_entry &e, const py::handle *args, size_t n) {
  std::string msg = std::string(e.name) +
      "(): incompatible function arguments. The following argument types are supported:\n    1. (";
  for (size_t k = 0; e.params[k]; ++k)
    msg += (k ? ", arg" : "arg") + std::to_string(k) + ": " + py_type(e.params[k]);
  msg += std::string(") -> ") + py_type(e.ret[0]) + "\n\nInvoked with: ";
  for (size_t k = 0; k < n; ++k) msg += (k ? ", " : "") + py::repr(args[k]).cast<std::string>();
  throw py::type_error(msg);
}

// pybind's own caster, with conversions on: what load_inline's binding of one function accepts.
template <class T> bool load(py::handle h, T &out) {
  py::detail::make_caster<T> c;
  if (!c.load(h, true)) return false;
  out = py::detail::cast_op<T>(std::move(c));
  return true;
}

D float_bits(float f) {  // a float argument: its bits in the low half of the xmm register
  U u = 0;
  std::memcpy(&u, &f, sizeof f);
  D d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

// A call: the arguments' handles, as many as the function takes (pybind's dispatcher has checked
// the count and refused keywords, as it does for load_inline's binding).
py::object call(const klsp_entry *e, const py::handle *args, size_t n) {
  const char r = e->ret[0];
  Slots a;
  Held held;  // the caller's copies of tensor arguments, destroyed by the caller
  alignas(std::vector<at::Tensor>) alignas(at::Tensor)
      unsigned char ret[sizeof(std::vector<at::Tensor>) > sizeof(at::Tensor) ? sizeof(std::vector<at::Tensor>)
                                                                             : sizeof(at::Tensor)];
  if (r == 'T' || r == 'V') a.i[a.ni++] = reinterpret_cast<U>(ret);  // the hidden return pointer
  for (size_t k = 0; k < n; ++k) {
    py::handle h = args[k];
    bool ok = false;
    switch (e->params[k]) {
      case 'T': case 'R': {
        py::detail::make_caster<at::Tensor> c;
        if ((ok = c.load(h, true))) a.i[a.ni++] = reinterpret_cast<U>(held.add(py::detail::cast_op<at::Tensor>(std::move(c))));
        break;
      }
      case 'f': { float v = 0; ok = load(h, v); a.x[a.nx++] = float_bits(v); break; }
      case 'd': { double v = 0; ok = load(h, v); a.x[a.nx++] = v; break; }
      case 'i': { int v = 0; ok = load(h, v); a.i[a.ni++] = static_cast<U>(static_cast<std::int64_t>(v)); break; }
      case 'l': { std::int64_t v = 0; ok = load(h, v); a.i[a.ni++] = static_cast<U>(v); break; }
      case 'b': { bool v = false; ok = load(h, v); a.i[a.ni++] = v ? 1 : 0; break; }
    }
    if (!ok) incompatible(*e, args, n);
  }
  union { float f; double d; int i; std::int64_t l; bool b; } out{};
  void *fn = e->fn;
  auto invoke = [&]() {
    switch (r) {
      case 'f': out.f = reinterpret_cast<float (*)(KLSP_TYPES)>(fn)(KLSP_ARGS); break;
      case 'd': out.d = reinterpret_cast<double (*)(KLSP_TYPES)>(fn)(KLSP_ARGS); break;
      case 'i': out.i = reinterpret_cast<int (*)(KLSP_TYPES)>(fn)(KLSP_ARGS); break;
      case 'l': out.l = reinterpret_cast<std::int64_t (*)(KLSP_TYPES)>(fn)(KLSP_ARGS); break;
      case 'b': out.b = reinterpret_cast<bool (*)(KLSP_TYPES)>(fn)(KLSP_ARGS); break;
      default: reinterpret_cast<void (*)(KLSP_TYPES)>(fn)(KLSP_ARGS);  // 'v', and 'T'/'V' through ret
    }
  };
  if (e->wrapped)
    torch::wrap_pybind_function([&]() { invoke(); })();
  else
    invoke();
  switch (r) {
    case 'T': {
      auto *t = std::launder(reinterpret_cast<at::Tensor *>(ret));
      at::Tensor v = std::move(*t);
      t->~Tensor();
      return py::cast(std::move(v));
    }
    case 'V': {
      auto *t = std::launder(reinterpret_cast<std::vector<at::Tensor> *>(ret));
      std::vector<at::Tensor> v = std::move(*t);
      t->~vector();
      return py::cast(std::move(v));
    }
    case 'f': return py::cast(out.f);
    case 'd': return py::cast(out.d);
    case 'i': return py::cast(out.i);
    case 'l': return py::cast(out.l);
    case 'b': return py::cast(out.b);
  }
  return py::none();
}

// One m.def of N py::handle parameters: pybind's own dispatch, as for a function of N arguments
// (no tuple or dict made per call, which *args/**kwargs would cost: 400 ns a call on 2 cores).
template <size_t... I>
void def_n(py::module_ &m, const klsp_entry *e, std::index_sequence<I...>) {
  m.def(e->name, [e](decltype((void)I, py::handle())... h) -> py::object {
    const py::handle args[] = {h..., py::handle()};
    return call(e, args, sizeof...(I));
  }, e->doc);
}

template <size_t... N>
void def_any(py::module_ &m, const klsp_entry *e, size_t n, std::index_sequence<N...>) {
  ((n == N ? def_n(m, e, std::make_index_sequence<N>{}) : void()), ...);
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (int k = 0; k < klsp_table_len; ++k) {
    const klsp_entry *e = &klsp_table[k];
    def_any(m, e, std::strlen(e->params), std::make_index_sequence<MAX_PARAMS + 1>{});
  }
}
"""
MAIN = MAIN.replace("@MAX_PARAMS@", str(MAX_PARAMS)).replace("@ENTRY@", ENTRY)


def not_defined(b: Binding, codes: list[tuple[str, str]], objects: list[Path], timeout: float = 60.0) -> str:
    """"" when the objects define every function the table names, else what is missing. A shared
    object may leave a name undefined (the import would fail); the binding by signature finds it
    at the link, this finds it before, so the build goes on with load_inline's text alike."""
    try:
        proc = subprocess.run(["nm", "--defined-only", "--format=posix", *map(str, objects)], capture_output=True,
                              text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nm: {exc}"
    if proc.returncode != 0:
        return f"nm: {proc.stderr.strip()[:200]}"
    # global (T) or weak (W) code: what another object can call
    defined = {f[0] for f in (line.split() for line in proc.stdout.splitlines()) if len(f) >= 2 and f[1] in "TW"}
    for (name, _, ret, params), (_, c) in zip(b.functions, codes):
        sym = mangled(name, c)
        if sym not in defined:
            return f"undefined reference to {sym} ({ret} {name}({', '.join(params)})): not defined with these types"
    return ""
