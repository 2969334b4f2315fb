"""Inductor's output module for one module and one set of shapes -> a standalone `ModelNew` file.

What the file holds: the reference itself (so `ModelNew(Model)` keeps its constructor, its
parameters and their state_dict keys), Inductor's Triton kernels as plain `@triton.jit`
functions (its private helpers replaced by the small ones in helpers.py, `tl_math.*` by
`tl.*`, `libdevice` from Triton itself), one `CONFIGS` table with each kernel's launch
configuration (what the tuner sweeps), and a lean `forward`: buffers from `torch.empty`
(`empty_strided` only where Inductor planned other strides), each kernel launched through a
`_Launcher` that compiles it once per device through Triton's JIT and then launches the compiled
kernel directly with a grid computed once (Triton's `kernel[grid](...)` re-binds every argument
on every call: tens of microseconds per launch, more than small kernels take). Where Inductor calls
a library (extern_kernels.mm/addmm/bmm/convolution) the file calls torch's own function. Nothing
of torch._inductor is imported; nothing is compiled by torch.compile at run time.

The file is written for the recorded shapes (Inductor bakes them into the kernels); any other
input shape, stride, dtype, device or a pointer not 16-byte aligned runs the reference's own forward.
Generated.eager holds, per kernel, eager's ATen ops that can stand in for it (eager_ops.py).

Max-autotune's Triton templates (GEMM, convolution) are copied as they are: their blocks are
constants in their bodies, their one launch config (num_warps, num_stages) goes into CONFIGS, and
their grid is the fixed one Inductor computed for those blocks.

Everything it cannot convert raises NotConvertible with one sentence saying why.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from . import eager_ops as _eager
from . import helpers as _helpers


class NotConvertible(Exception):
    """The recorded code cannot become a standalone file; str() is one sentence saying why."""


# Inductor's heuristics decorators we convert, and what kind of kernel each makes.
_KINDS = {"pointwise": "pointwise", "reduction": "reduction", "persistent_reduction": "persistent_reduction",
          "template": "template"}
_GRIDS = {"Grid1D", "Grid2D"}
# A template (max-autotune's Triton GEMM or convolution) has its blocks as constants in its body,
# one launch config in its decorator, and its grid as three numbers after its arguments in the
# launch call (Inductor's FixedGrid: `kernel.run(a, b, out, 32, 1, 1, stream=...)`).
_TEMPLATE_GRIDS = {"FixedGrid"}
_DECORATOR_INT = re.compile(r"^\s*(num_warps|num_stages)=(\d+),", re.M)
_TRITON_DEF = re.compile(
    r"^(\w+) = async_compile\.triton\('(\w+)', '''(.*?)''', device_str='cuda'\)", re.S | re.M)
_OTHER_COMPILE = re.compile(r"^(\w+) = async_compile\.(\w+)\(", re.M)
_DECORATOR = re.compile(r"@triton_heuristics\.(\w+)\(")
_GRID_TYPE = re.compile(r"'grid_type': '(\w+)'")
_OFFSET = re.compile(r"^\s*(x|y|z)offset = tl\.program_id\((\d)\) \* ([XYZ]BLOCK)\s*$", re.M)
_ANY_OFFSET = re.compile(r"^\s*(x|y|z)offset = (.*)$", re.M)
_KERNEL_GLOBALS = {"tl", "triton", "libdevice", "float", "int", "range", "min", "max", "abs", "len",
                   "True", "False", "None", "math"}
_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex64", "float8_e4m3fn", "float8_e5m2"}
_EXTERN = {  # extern_kernels.NAME -> torch function with the same positional order
    "mm": "torch.mm", "addmm": "torch.addmm", "bmm": "torch.bmm", "baddbmm": "torch.baddbmm",
    "addmv": "torch.addmv", "mv": "torch.mv",
}
_DROP_CALLS = {"assert_size_stride", "assert_alignment", "torch.cuda.set_device", "args.clear",
               "run_intermediate_hooks"}


@dataclass
class Kernel:
    name: str
    kind: str                   # pointwise | reduction | persistent_reduction
    grid_type: str
    text: str                   # the @triton.jit function, converted
    params: list[str]           # runtime parameters, in order
    constexprs: list[str]       # launch-time constexpr parameters (XBLOCK, R0_BLOCK, ...)
    grid_dims: dict[str, int]   # "x" -> program_id axis
    unmasked: set[str]          # dims with no bounds mask: their block must divide the numel
    helpers: set[str] = field(default_factory=set)
    grid: str = ""              # the launch grid (3 dims) as an expression of the config `cfg`
    decorated: dict[str, int] = field(default_factory=dict)  # a template's num_warps, num_stages


@dataclass
class Launch:
    kernel: str
    args: list[str]             # the runtime arguments, as source
    numels: dict[str, int]      # "x" -> xnumel, "r0_" -> r0_numel


@dataclass
class Generated:
    source: str
    kernels: list[Kernel]
    launches: list[Launch]
    configs: dict[str, dict[str, int]]
    externs: list[str]          # torch functions the forward calls (library work: GEMM, convolution)
    shapes: dict[str, tuple]    # forward input -> (size, stride, dtype)
    eager: dict[str, Any] = field(default_factory=dict)       # kernel -> eager_ops.EagerOp
    eager_why: dict[str, str] = field(default_factory=dict)   # kernel -> why it has no eager variant


# -- kernels ------------------------------------------------------------------------------------

def _kernels(code: str) -> dict[str, Kernel]:
    out: dict[str, Kernel] = {}
    for m in _OTHER_COMPILE.finditer(code):
        if m.group(2) not in ("triton", "wait"):
            raise NotConvertible(f"kernel {m.group(1)} is compiled by Inductor's {m.group(2)} backend, "
                                 "which the writer does not convert (only Triton kernels)")
    for m in _TRITON_DEF.finditer(code):
        var, name, body = m.group(1), m.group(2), m.group(3)
        if var != name:
            raise NotConvertible(f"kernel {name} is bound to another name ({var})")
        out[name] = _kernel(name, body)
    return out


def _kernel(name: str, body: str) -> Kernel:
    deco = _DECORATOR.search(body)
    if deco is None:
        raise NotConvertible(f"kernel {name} has no Inductor heuristics decorator the writer knows")
    kind = _KINDS.get(deco.group(1))
    if kind is None:
        raise NotConvertible(f"kernel {name} is an Inductor {deco.group(1)} kernel (a foreach or split-scan "
                             "kernel, for example), which the writer does not convert yet")
    grid = _GRID_TYPE.search(body)
    grid_type = grid.group(1) if grid else "Grid1D"
    if kind == "template" and grid_type not in _TEMPLATE_GRIDS:
        raise NotConvertible(f"template {name} uses Inductor's {grid_type} launch grid; the writer launches "
                             "templates only with the fixed grid Inductor gives them (FixedGrid)")
    if kind != "template" and grid_type not in _GRIDS:
        raise NotConvertible(f"kernel {name} uses Inductor's {grid_type} launch grid, which the writer "
                             "does not convert (only 1D and 2D grids)")
    start = body.find("@triton.jit")
    if start < 0:
        raise NotConvertible(f"kernel {name} has no @triton.jit function")
    text = body[start:].rstrip() + "\n"
    try:
        fn = ast.parse(text).body[0]
    except SyntaxError as exc:
        raise NotConvertible(f"kernel {name} does not parse as Python ({exc.msg})") from None
    if not isinstance(fn, ast.FunctionDef):
        raise NotConvertible(f"kernel {name} is not a function")
    params, constexprs = [], []
    for a in fn.args.args:
        ann = ast.unparse(a.annotation) if a.annotation is not None else ""
        if not ann.endswith("constexpr") and constexprs:
            # The compiled kernel's runner takes every parameter in order; the file passes the
            # launch-time constants after the runtime arguments.
            raise NotConvertible(f"kernel {name} takes a runtime argument ({a.arg}) after its launch-time "
                                 "constants, which the writer's launcher does not pass")
        (constexprs if ann.endswith("constexpr") else params).append(a.arg)
    used: set[str] = set(re.findall(r"\btriton_helpers\.(\w+)\b", text))
    unknown = sorted(used - set(_helpers.HELPERS))
    if unknown:
        raise NotConvertible(f"kernel {name} calls Inductor's private helper triton_helpers.{unknown[0]}, "
                             "which the writer has no plain Triton version of")
    text = re.sub(r"\btriton_helpers\.(\w+)\b", r"\1", text)
    text = re.sub(r"\btl_math\.(\w+)\b", r"tl.\1", text)
    _check_globals(name, text, params + constexprs)
    dims: dict[str, int] = {}
    for m in _ANY_OFFSET.finditer(text):
        exact = _OFFSET.match(m.group(0))
        if exact is None:
            raise NotConvertible(f"kernel {name} computes its {m.group(1)} offset in a way the writer "
                                 f"does not launch ({m.group(2).strip()[:60]})")
        dims[exact.group(1)] = int(exact.group(2))
    decorated = {k: int(v) for k, v in _DECORATOR_INT.findall(body[:start])} if kind == "template" else {}
    if kind == "template" and (constexprs or dims):
        raise NotConvertible(f"template {name} takes its blocks at launch, which Inductor's templates do not "
                             "(the writer launches a template as Inductor does: its constants in its body)")
    return Kernel(name, kind, grid_type, text, params, constexprs, dims, unmasked_dims(text), used,
                  decorated=decorated)


def unmasked_dims(text: str) -> set[str]:
    """Dims a kernel's text gives no bounds mask (`xmask = tl.full(...)`): Inductor left it out
    because the numel is a multiple of every block it would try."""
    return {d for d in ("x", "y", "z", "r0_", "r1_") if re.search(rf"^\s*{d}mask = tl\.full\(", text, re.M)}


def _check_globals(name: str, text: str, params: list[str]) -> None:
    """Every free name in a kernel must be one the generated file defines."""
    tree = ast.parse(text)
    bound = set(params) | {name} | set(_helpers.HELPERS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.For, ast.comprehension)):
            for t in ast.walk(node.target):
                if isinstance(t, ast.Name):
                    bound.add(t.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                and node.id not in bound and node.id not in _KERNEL_GLOBALS:
            raise NotConvertible(f"kernel {name} uses {node.id}, a name from Inductor's runtime the writer "
                                 "cannot replace")


# -- launch configurations ------------------------------------------------------------------------

def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (max(1, n) - 1).bit_length())


def block_ok(kernel: Kernel, dim: str, block: int, numel: int) -> bool:
    """A block size this kernel can launch with: a power of two, and, where the kernel has no
    bounds mask on that dim (Inductor left it out because its numel is a multiple of every block
    it would try), one that divides the numel."""
    if block < 1 or block & (block - 1):
        return False
    return dim not in kernel.unmasked or numel % block == 0


def _fit(kernel: Kernel, dim: str, want: int, numel: int) -> int:
    b = want
    while b > 1 and not block_ok(kernel, dim, b, numel):
        b //= 2
    return b


def default_config(kernel: Kernel, numels: dict[str, int]) -> dict[str, int]:
    """A reasonable first configuration when the recording did not say which one Inductor's
    autotuner picked (the sweep then measures its neighbours)."""
    x = numels.get("x", 1)
    cfg: dict[str, int] = {}
    if kernel.kind == "template":  # its blocks are in its body: what Inductor's autotuner chose
        return {"num_warps": kernel.decorated.get("num_warps", 4), "num_stages": kernel.decorated.get("num_stages", 2)}
    if kernel.kind == "pointwise":
        if "YBLOCK" in kernel.constexprs:
            cfg["YBLOCK"] = _fit(kernel, "y", min(32, pow2(numels.get("y", 1))), numels.get("y", 1))
            cfg["XBLOCK"] = _fit(kernel, "x", min(32, pow2(x)), x)
        else:
            cfg["XBLOCK"] = _fit(kernel, "x", min(1024, pow2(x)), x)
        cfg["num_warps"] = 4
    elif kernel.kind == "persistent_reduction":
        r = pow2(numels.get("r0_", 1))
        cfg["XBLOCK"] = _fit(kernel, "x", max(1, min(pow2(x), 4096 // r, 64)), x)
        cfg["num_warps"] = 8 if r >= 2048 else 4
    else:
        r = numels.get("r0_", 1)
        cfg["XBLOCK"] = _fit(kernel, "x", 1, x)
        if "R0_BLOCK" in kernel.constexprs:
            cfg["R0_BLOCK"] = _fit(kernel, "r0_", min(2048, pow2(r)), r)
        cfg["num_warps"] = 8 if cfg.get("R0_BLOCK", 1) >= 1024 else 4
    for c in kernel.constexprs:
        if c not in cfg:
            raise NotConvertible(f"kernel {kernel.name} takes {c} at launch, which the writer has no "
                                 "configuration for")
    cfg["num_stages"] = 1
    return cfg


def normalize_config(kernel: Kernel, recorded: dict[str, Any], numels: dict[str, int]) -> dict[str, int]:
    """Inductor's chosen config (kwargs, num_warps, num_stages) in the file's form; a recorded
    block the kernel cannot take (see block_ok) falls back to the default."""
    base = default_config(kernel, numels)
    kw = dict(recorded.get("kwargs") or {})
    out = dict(base)
    for c in kernel.constexprs:
        if c in kw and isinstance(kw[c], int):
            dim = c[:-5].lower() if c != "R0_BLOCK" else "r0_"
            if block_ok(kernel, dim, kw[c], numels.get(dim, 1)):
                out[c] = kw[c]
    for k in ("num_warps", "num_stages"):
        if isinstance(recorded.get(k), int) and recorded[k] > 0:
            out[k] = recorded[k]
    return out


# -- the call body ----------------------------------------------------------------------------

def _call_function(code: str) -> tuple[ast.Module, ast.FunctionDef]:
    """The parsed module and its `call(args)` function."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise NotConvertible(f"the recorded Inductor module does not parse ({exc.msg}, line {exc.lineno})") from None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "call"
             and [a.arg for a in n.args.args][-1:] == ["args"]]
    if len(calls) != 1:
        raise NotConvertible("the recorded module has no single `call(args)` function (not an Inductor "
                             "output module?)")
    return tree, calls[0]


def _call_body(code: str) -> list[ast.stmt]:
    """The call's statements, with CUDA-graph partitions (max-autotune's `self.partitions[i](...)`)
    inlined from their `partition_i` functions."""
    tree, fn = _call_function(code)
    parts = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("partition_")}
    lists: dict[str, list[ast.expr]] = {}
    out: list[ast.stmt] = []
    for st in _flatten(fn.body):
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.List) and len(st.targets) == 1 \
                and isinstance(st.targets[0], ast.Name) and st.targets[0].id.endswith("_args"):
            lists[st.targets[0].id] = list(st.value.elts)
            continue
        m = re.fullmatch(r"self\.partitions\[(\d+)\]\((\w+)\)", ast.unparse(st.value)) \
            if isinstance(st, ast.Assign) else None
        if m is None:
            out.append(st)
            continue
        part = parts.get(f"partition_{m.group(1)}")
        if part is None or m.group(2) not in lists:
            raise NotConvertible(f"the recorded module calls partition {m.group(1)}, which it does not define")
        outer = lists[m.group(2)]
        targets = st.targets[0].elts if isinstance(st.targets[0], (ast.Tuple, ast.List)) else [st.targets[0]]
        for inner in _flatten(part.body):
            if isinstance(inner, ast.Assign) and ast.unparse(inner.value) == "args":
                t = inner.targets[0]
                names = t.elts if isinstance(t, ast.Tuple) else [t]
                out += [ast.parse(f"{ast.unparse(n)} = {ast.unparse(v)}").body[0] for n, v in zip(names, outer)]
            elif isinstance(inner, ast.Return):
                vals = inner.value.elts if isinstance(inner.value, ast.Tuple) else [inner.value]
                out += [ast.parse(f"{ast.unparse(t)} = {ast.unparse(v)}").body[0] for t, v in zip(targets, vals)]
            else:
                out.append(inner)
    return out


def _flatten(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for st in body:
        if isinstance(st, ast.With) and "DeviceGuard" in ast.unparse(st.items[0].context_expr):
            out += _flatten(st.body)
        else:
            out.append(st)
    return out


def _const(node: ast.AST, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise NotConvertible(f"{what} is not a constant ({ast.unparse(node)[:60]}): the shapes are dynamic, "
                             "and the writer needs static shapes") from None


class _Expr(ast.NodeTransformer):
    """Inductor's wrapper helpers -> public torch calls."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.externs: list[str] = []

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        fn = ast.unparse(node.func)
        if fn == "empty_strided_cuda":
            size, stride, dtype = node.args
            if _contiguous(_const(size, "a buffer size"), _const(stride, "a buffer stride")):
                return _parse(f"torch.empty({ast.unparse(size)}, dtype={ast.unparse(dtype)}, device={self.device})")
            return _parse(f"torch.empty_strided({ast.unparse(size)}, {ast.unparse(stride)}, "
                          f"dtype={ast.unparse(dtype)}, device={self.device})")
        if fn == "reinterpret_tensor":
            t, size, stride, off = node.args
            return _parse(f"torch.as_strided({ast.unparse(t)}, {ast.unparse(size)}, {ast.unparse(stride)}, "
                          f"{ast.unparse(off)})")
        if fn.startswith("extern_kernels."):
            op = fn.split(".", 1)[1]
            if op == "convolution":
                return self._conv(node)
            if op not in _EXTERN:
                raise NotConvertible(f"Inductor calls the library kernel extern_kernels.{op}, which the writer "
                                     "has no torch equivalent for")
            self.externs.append(_EXTERN[op])
            node.func = _parse(_EXTERN[op])
            return node
        if fn.startswith(("torch.ops.", "aten.")) or fn in ("alloc_from_pool", "empty_strided_cpu"):
            raise NotConvertible(f"the recorded forward calls {fn}, which the writer does not convert")
        return node

    def _conv(self, node: ast.Call) -> ast.AST:
        kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
        names = ("stride", "padding", "dilation", "transposed", "output_padding", "groups", "bias")
        pos = [ast.unparse(a) for a in node.args]
        if len(pos) < 2 or any(n not in kw for n in names[:6]):
            raise NotConvertible("Inductor's convolution call has arguments the writer does not know")
        self.externs.append("torch.convolution")
        return _parse(f"torch.convolution({pos[0]}, {pos[1]}, {kw.get('bias', 'None')}, {kw['stride']}, "
                      f"{kw['padding']}, {kw['dilation']}, {kw['transposed']}, {kw['output_padding']}, "
                      f"{kw['groups']})")


def _contiguous(size: tuple, stride: tuple) -> bool:
    """Row-major strides for `size` (size-1 dims may have any stride): torch.empty gives that layout."""
    want = 1
    for n, s in zip(reversed(tuple(size)), reversed(tuple(stride))):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _parse(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


# -- the file -----------------------------------------------------------------------------------

def _forward_args(reference_source: str) -> tuple[str, list[str]]:
    try:
        tree = ast.parse(reference_source)
    except SyntaxError as exc:
        raise NotConvertible(f"the reference does not parse ({exc.msg}, line {exc.lineno})") from None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    a = item.args
                    if a.vararg or a.kwarg or a.kwonlyargs:
                        raise NotConvertible("the reference's forward takes *args/**kwargs or keyword-only "
                                             "arguments, which the writer does not map")
                    names = [x.arg for x in a.args[1:]]
                    sig = ", ".join(["self", *names])
                    return sig, names
    raise NotConvertible("the reference has no class Model with a forward")


def guess_arg_exprs(graph_args: list[str], arg_shapes: dict[str, tuple], forward_inputs: list[str],
                    param_shapes: dict[str, tuple]) -> list[str]:
    """The graph's inputs as expressions of ModelNew (self.<param> or a forward argument), from
    their shapes, when the recording did not hold the exact mapping (the Worker's request does).
    Each parameter must match exactly one graph input by shape; the rest are the forward's inputs
    in order. Ambiguity raises NotConvertible."""
    free = list(graph_args)
    out: dict[str, str] = {}
    for pname, shape in param_shapes.items():
        hits = [g for g in free if tuple(arg_shapes.get(g, ((),))[0]) == tuple(shape)]
        same = [p for p, s in param_shapes.items() if tuple(s) == tuple(shape)]
        if not hits:
            continue  # a parameter the compiled graph does not read (or folded away)
        if len(hits) > 1 or len(same) > 1:
            raise NotConvertible(f"cannot tell which graph input is the parameter {pname} (several have its "
                                 "shape); record the module with the Worker's inductor_code request, "
                                 "which maps them exactly")
        out[hits[0]] = f"self.{pname}"
        free.remove(hits[0])
    if len(free) != len(forward_inputs):
        raise NotConvertible(f"the compiled graph takes {len(free)} inputs besides the parameters, the "
                             f"forward {len(forward_inputs)}; the writer cannot map them")
    for g, name in zip(free, forward_inputs):
        out[g] = name
    return [out[g] for g in graph_args]


def graph_inputs(code: str) -> tuple[list[str], dict[str, tuple]]:
    """The recorded call's input names and their (size, stride) from its assert_size_stride lines."""
    names: list[str] = []
    shapes: dict[str, tuple] = {}
    for st in _call_body(code):
        if isinstance(st, ast.Assign) and ast.unparse(st.value) == "args":
            t = st.targets[0]
            if not names:  # the call's own inputs, not a partition's
                names = [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                and ast.unparse(st.value.func) == "assert_size_stride":
            a = st.value.args
            shapes[ast.unparse(a[0])] = (tuple(_const(a[1], "a size")), tuple(_const(a[2], "a stride")))
    return names, shapes


def write_model_new(reference_source: str, code: str | list[str], arg_exprs: list[str] | None = None,
                    configs: dict[str, dict[str, Any]] | None = None, *, mode: str = "default",
                    torch_version: str = "", input_dtypes: dict[str, str] | None = None) -> Generated:
    """The standalone ModelNew file for `reference_source` from Inductor's output module `code`.

    arg_exprs: for each graph input in order, what it is in ModelNew ("self.weight", "x"); None:
    guessed from shapes (guess_arg_exprs). configs: Inductor's chosen launch config per kernel
    ({"kwargs": {...}, "num_warps": n, "num_stages": n}), from the recording; missing ones get
    default_config. Raises NotConvertible."""
    from kernel_lsp.engine.protocol import reference_only_source

    if isinstance(code, list):
        if not code:
            raise NotConvertible("the recording holds no Inductor output module")
        if len(code) != 1:
            raise NotConvertible(f"torch.compile split this module into {len(code)} graphs (graph breaks); "
                                 "the writer needs a single graph")
        code = code[0]
    ref = reference_only_source(reference_source)
    if ref is None:
        raise NotConvertible("the reference does not parse")
    sig, forward_inputs = _forward_args(ref)
    kernels = _kernels(code)
    names, shapes = graph_inputs(code)
    if arg_exprs is None:
        arg_exprs = guess_arg_exprs(names, shapes, forward_inputs, _param_shapes(ref))
    if len(arg_exprs) != len(names):
        raise NotConvertible(f"the recording maps {len(arg_exprs)} graph inputs, the compiled graph takes "
                             f"{len(names)}")
    inputs = {n: e for n, e in zip(names, arg_exprs) if not e.startswith("self.")}
    if not inputs:
        raise NotConvertible("the compiled graph reads none of the forward's inputs")
    first_input = next(iter(inputs))
    conv = _Expr("dev")
    body: list[str] = [f"{n} = {e}" for n, e in zip(names, arg_exprs)] + [f"dev = {first_input}.device"]
    launches: list[Launch] = []
    cfgs: dict[str, dict[str, int]] = {}
    returned = False
    for st in _call_body(code):
        text = ast.unparse(st)
        if isinstance(st, ast.Assign) and ast.unparse(st.value) == "args":
            continue
        if isinstance(st, ast.Delete) or isinstance(st, ast.Pass):
            continue
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            fname = ast.unparse(st.value.func)
            if fname in _DROP_CALLS:
                continue
            if fname.endswith(".run") and fname[:-4] in kernels:
                launch, line = _launch(kernels[fname[:-4]], st.value, conv)
                launches.append(launch)
                k = kernels[launch.kernel]
                rec = (configs or {}).get(k.name)
                if k.name not in cfgs:
                    cfgs[k.name] = normalize_config(k, rec, launch.numels) if rec else default_config(k, launch.numels)
                body.append(line)
                continue
        if isinstance(st, ast.Assign) and re.match(r"get_raw_stream\(", ast.unparse(st.value)):
            continue
        if isinstance(st, ast.Return):
            value = st.value
            if isinstance(value, ast.Tuple) and len(value.elts) == 1:
                value = value.elts[0]
            body.append(f"return {ast.unparse(conv.visit(value))}")
            returned = True
            continue
        if isinstance(st, ast.Assign) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)):
            body.append(ast.unparse(conv.visit(st)))
            continue
        raise NotConvertible(f"the recorded forward has a statement the writer does not convert: {text[:80]}")
    if not returned:
        raise NotConvertible("the recorded forward returns nothing the writer can see")
    eager, eager_why = _eager_ops(code, kernels, launches, body, {g: tuple(shapes[g][0]) for g in names if g in shapes})
    used = [k for k in kernels.values() if k.name in cfgs]
    helper_names = _helpers.closure(set().union(*[k.helpers for k in used]) if used else set())
    needs_libdevice = any("libdevice." in k.text for k in used) or _helpers.uses_libdevice(helper_names)
    dtypes = {inputs[g]: t for g, t in recorded_dtypes(code).items() if g in inputs}
    dtypes.update(input_dtypes or {})
    guard = _guard(inputs, shapes, dtypes)
    source = _render(ref, sig, body, used, cfgs, helper_names, needs_libdevice, guard, conv.externs, mode,
                     torch_version)
    try:
        ast.parse(source)
    except SyntaxError as exc:  # a writer bug, said as one
        raise NotConvertible(f"the generated file does not parse ({exc.msg}, line {exc.lineno})") from None
    return Generated(source, used, launches, cfgs, sorted(set(conv.externs)),
                     {inputs[n]: shapes.get(n, ((), ())) for n in inputs}, eager, eager_why)


_ALLOC = re.compile(r"^(\w+) = torch\.(?:empty|empty_strided)\(\(([\d, ]*)\)")


def _eager_ops(code: str, kernels: dict[str, Kernel], launches: list[Launch], body: list[str],
               input_sizes: dict[str, tuple]) -> tuple[dict[str, _eager.EagerOp], dict[str, str]]:
    """For each launched kernel, eager's ops in its place where its graph fragment allows (eager_ops.py),
    else why not."""
    frags = _eager.fragments(code)
    known = {g: g for g in input_sizes}
    sizes = dict(input_sizes)
    ops: dict[str, _eager.EagerOp] = {}
    why: dict[str, str] = {}
    it = iter(launches)
    for i, line in enumerate(body):
        m = _ALLOC.match(line)
        if m:
            sizes[m.group(1)] = tuple(int(v) for v in filter(None, (p.strip() for p in m.group(2).split(","))))
        if not line.startswith("LAUNCHERS["):
            continue
        launch = next(it)
        k, frag = kernels[launch.kernel], frags.get(launch.kernel)
        if frag is None:
            why.setdefault(k.name, "Inductor's code does not say which ATen nodes it computes")
            continue
        outs = [launch.args[j] for j, p in enumerate(k.params) if p.startswith(("out_ptr", "in_out_ptr"))]
        earlier = "\n".join(body[:i])
        aliased = bool(outs) and re.search(rf"\b{re.escape(outs[0])}\b[^=\n]*\)", earlier) is not None
        if k.name not in ops and k.name not in why:
            try:
                ops[k.name] = _eager.eager_op(frag, k.params, launch.args, line, known, sizes, aliased)
            except _eager.NotEager as exc:
                why[k.name] = str(exc)
        if len(frag.returns) == 1 and len(outs) == 1 and re.fullmatch(r"\w+", outs[0]):
            known[frag.returns[0]] = outs[0]
    return ops, why


_SHORT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
                 "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "b8": "bool"}


def recorded_dtypes(code: str) -> dict[str, str]:
    """Graph inputs' dtypes from the recorded module's graph comments (`%arg0_1 : Tensor "f32[...]`)."""
    out = {}
    for m in re.finditer(r'%(\w+) : Tensor "(\w+)\[', code):
        if m.group(2) in _SHORT_DTYPES:
            out.setdefault(m.group(1), _SHORT_DTYPES[m.group(2)])
    return out


def _param_shapes(ref: str) -> dict[str, tuple]:
    """Parameter and buffer shapes of Model(*get_init_inputs()), built on the meta device."""
    try:
        import torch
    except ImportError:
        raise NotConvertible("guessing the graph's inputs needs torch here") from None
    ns: dict[str, Any] = {"__name__": "kernel_lsp_reference"}
    try:
        with torch.device("meta"):
            exec(compile(ref, "<reference>", "exec"), ns)  # noqa: S102 - the user's own reference
            model = ns["Model"](*ns["get_init_inputs"]())
    except Exception as exc:  # noqa: BLE001 - any failure is a sentence
        raise NotConvertible(f"building the reference on the meta device failed ({type(exc).__name__}: "
                             f"{str(exc)[:100]})") from None
    out = {n: tuple(p.shape) for n, p in model.named_parameters()}
    out.update({n: tuple(b.shape) for n, b in model.named_buffers()})
    return out


def _launch(kernel: Kernel, call: ast.Call, conv: _Expr) -> tuple[Launch, str]:
    args = [a for a in call.args]
    numels: dict[str, int] = {}
    grid: list[str] = ["1", "1", "1"]
    if kernel.kind == "template":  # FixedGrid: the grid's three numbers follow the arguments
        if len(args) != len(kernel.params) + 3:
            raise NotConvertible(f"template {kernel.name} is launched with {len(args)} arguments for its "
                                 f"{len(kernel.params)} parameters and a grid of 3")
        grid = [str(int(_const(a, f"{kernel.name}'s grid"))) for a in args[-3:]]
        args = args[:-3]
    elif len(args) != len(kernel.params):
        raise NotConvertible(f"kernel {kernel.name} is launched with {len(args)} arguments for its "
                             f"{len(kernel.params)} parameters")
    for p, a in zip(kernel.params, args):
        m = re.fullmatch(r"(x|y|z|r0_|r1_)numel", p)
        if m:
            numels[m.group(1)] = int(_const(a, f"{kernel.name}'s {p}"))
    for dim, axis in kernel.grid_dims.items():  # (a template has none: its grid is fixed)
        if dim not in numels:
            raise NotConvertible(f"kernel {kernel.name} has no {dim}numel argument to size its grid")
        grid[axis] = f"triton.cdiv({numels[dim]}, cfg[{(dim.upper() + 'BLOCK')!r}])"
    texts = [ast.unparse(conv.visit(a)) for a in args]
    kernel.grid = f"({', '.join(grid)})"
    return Launch(kernel.name, texts, numels), f"LAUNCHERS[{kernel.name!r}](dev, {', '.join(texts)})"


def _guard(inputs: dict[str, str], shapes: dict[str, tuple], dtypes: dict[str, str]) -> list[str]:
    conds = []
    for graph_name, expr in inputs.items():
        size, stride = shapes.get(graph_name, (None, None))
        if size is None:
            continue
        conds.append(f"tuple({expr}.shape) != {tuple(size)!r}")
        conds.append(f"{expr}.stride() != {tuple(stride)!r}")
        conds.append(f"not {expr}.is_cuda")
        # Triton specializes a kernel on 16-byte aligned pointers; a launcher reused across calls
        # must never see a less aligned one.
        conds.append(f"{expr}.data_ptr() % 16")
        if expr in dtypes and dtypes[expr].split(".")[-1] in _DTYPES:
            conds.append(f"{expr}.dtype != torch.{dtypes[expr].split('.')[-1]}")
    return conds


def _render(ref: str, sig: str, body: list[str], kernels: list[Kernel], cfgs: dict[str, dict[str, int]],
            helper_names: list[str], needs_libdevice: bool, guard: list[str], externs: list[str], mode: str,
            torch_version: str) -> str:
    lib = sorted(set(externs))
    head = [
        '"""ModelNew: the Triton kernels Inductor (PyTorch\'s compiler' + (f", torch {torch_version}" if torch_version else "")
        + f", mode {mode!r}) wrote for this module at these input shapes, as a standalone file.",
        "",
        "Written by kernel-lsp without an LLM. It runs with torch and Triton only: nothing is compiled by",
        "PyTorch and none of its compiler's runtime is imported. CONFIGS holds each kernel's launch",
        "configuration (the no-LLM tuner sweeps it). "
        + (f"Library work stays with torch: {', '.join(lib)}. " if lib else "")
        + "Inputs of other shapes, strides, dtypes or",
        "devices than the recorded ones (or not 16-byte aligned) run the reference's forward. Each kernel",
        "is compiled once per device, then launched through Triton's compiled kernel (see _Launcher).",
        "Inference only: outputs carry no autograd graph.",
        '"""',
        "",
    ]
    future = re.findall(r"^from __future__ import [^\n]+$", ref, re.M)  # must stay first
    ref = re.sub(r"^from __future__ import [^\n]+$", "", ref, flags=re.M)
    out = head + future + [ref.strip("\n"), "", "", "import triton", "import triton.language as tl"]
    if needs_libdevice:
        out.append("from triton.language.extra import libdevice")
    if helper_names:
        out += ["", "", "# Plain Triton versions of the helpers Inductor's kernels use (its own are private)."]
        for n in helper_names:
            out.append(_helpers.HELPERS[n][0].strip("\n"))
            out.append("")
    out += ["", "# The kernels, as Inductor wrote them for these shapes."]
    for k in kernels:
        out += ["", k.text.rstrip("\n"), ""]
    out += ["", "# Launch configuration of each kernel (block sizes, warps, pipeline stages).", "CONFIGS = {"]
    for name, cfg in cfgs.items():
        out.append(f"    {name!r}: dict({', '.join(f'{k}={v}' for k, v in cfg.items())}),")
    out += ["}", "", "", LAUNCHER.strip("\n"), "", "", "LAUNCHERS = {"]
    for k in kernels:
        consts = repr(tuple(k.constexprs))
        out.append(f"    {k.name!r}: _Launcher({k.name}, {k.name!r}, {consts}, lambda cfg: {k.grid}),")
    out += ["}", "", "", "class ModelNew(Model):", f"    def forward({sig}):"]
    args = ", ".join(sig.split(", ")[1:])
    if guard:
        out.append("        if (" + (" or\n                ".join(guard)) + "):")
        out.append(f"            return super().forward({args})  # not the recorded shapes")
    # Inference only: the launches build no autograd graph, and torch's out= calls refuse
    # parameters that require grad unless grad mode is off.
    out.append("        with torch.no_grad():")
    for line in body:
        for piece in line.split("\n"):
            out.append("            " + piece)
    return "\n".join(out) + "\n"


# Written into every file with kernels: the lean launch (what Inductor's own launcher does).
# Triton's `kernel[grid](...)` binds and specializes every argument and looks the compiled kernel up
# on each call: tens of microseconds of Python per launch, more than the kernel itself on small
# Tasks. The shapes here are fixed, so each kernel is compiled once per device through the JIT, then
# launched through the compiled kernel's own launcher. Triton's public runner for it
# (`compiled[grid](*args)`, as its fused-softmax tutorial does) also asks the current device and
# stream and builds launch metadata for its hooks on every call; `_direct` calls the same launcher
# as that runner does (`compiled.run(grid, stream, function, packed metadata, metadata, hooks,
# *args)`, checked against Triton 3.3 to 3.6), with the grid, function and device fixed and no hooks,
# on those Triton versions while no launch hook is installed (a profiler's), else the runner.
LAUNCHER = '''
def _direct(compiled, grid, device):
    """The compiled kernel's own launcher, called as Triton's runner calls it, without its per-launch
    device lookup, launch metadata and hooks; None where that is not known to hold."""
    version = tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())
    knobs = getattr(triton, "knobs", None)
    hooks = getattr(getattr(knobs, "runtime", None), "launch_enter_hook", None)
    if not (3, 3) <= version < (3, 7) or device.type != "cuda":
        return None
    if hooks is not None and (not hasattr(hooks, "calls") or hooks.calls):  # a hook (3.6: a chain of them)
        return None
    if getattr(type(compiled), "launch_enter_hook", None) is not None:  # Triton 3.3's hooks
        return None
    stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    launch, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    if stream_of is None or launch is None or function is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    gx, gy, gz = grid

    def run(*args):
        launch(gx, gy, gz, stream_of(index), function, meta, None, None, None, *args)
    return run


class _Launcher:
    """One kernel at the recorded shapes: the first call on a device compiles and launches it through
    Triton's JIT; later calls launch the compiled kernel directly, with the grid computed once."""

    def __init__(self, kernel, name, constexprs, grid):
        self.kernel, self.cfg = kernel, CONFIGS[name]
        self.consts = tuple(self.cfg[c] for c in constexprs)  # passed after the runtime arguments
        self.grid = grid(self.cfg)
        self.runs = {}

    def __call__(self, device, *args):
        run = self.runs.get(device)
        if run is None:
            compiled = self.kernel[self.grid](*args, **self.cfg)
            # Triton's interpreter (TRITON_INTERPRET=1) has no compiled kernel: it keeps the JIT launch.
            if hasattr(compiled, "packed_metadata"):
                runner = compiled[self.grid]  # (loads the kernel's handles)
                self.runs[device] = _direct(compiled, self.grid, device) or runner
            else:
                self.runs[device] = False
        elif run is False:
            self.kernel[self.grid](*args, **self.cfg)
        else:
            run(*args, *self.consts)
'''


def describe(gen: Generated, eager_kept: int = 0) -> str:
    """One line for labels: how many kernels the file launches, which library calls."""
    n = len(gen.kernels) - eager_kept
    text = f"{n} Triton kernel{'s' if n != 1 else ''}"
    if gen.externs:
        text += f", {len(gen.externs)} torch library call{'s' if len(gen.externs) != 1 else ''} ({', '.join(gen.externs)})"
    return text
