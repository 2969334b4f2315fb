"""Eager's ops in place of one generated kernel: the variant that keeps PyTorch's op where it is faster.

Inductor's output module says, above each kernel, which nodes of its ATen graph the kernel computes
("Graph fragment": the placeholders it reads and the `call_function` nodes it fuses, each with its
`torch.ops.aten.*` target and arguments) and which node it returns. Where that is a whole
computation, the same nodes can be run eagerly, op by op, in place of the launch: the variant
replaces the launch with those `torch.ops.aten` calls, reading the buffers the earlier steps wrote
and leaving the result in the buffer the next steps read (in the layout they index by). The Search
times it like any Candidate, so eager's op is kept only where it is faster than the kernel.

A kernel is left to Triton (with the reason in `why`) when its fragment is not a whole computation:
part of a split reduction (it reads or writes Inductor's partial buffers), several outputs or an
in-place update, an input no earlier step names, a node that is not an ATen op (prims, random ops)
or an argument that does not read back as Python.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_BLOCK = re.compile(r"^# kernel path:.*?\n((?:#.*\n)*?)(\w+) = async_compile\.triton\(", re.M)
_NODE = re.compile(r"^#   %(\w+) : (?:Tensor \"([a-z0-9]+)\[([^\]]*)\]\[[^\]]*\][^\"]*\")?\s*(?:\[num_users=\d+\])? = "
                   r"(PlaceHolder|call_function)\[target=([\w.]+)\](?:\(args = \((.*)\), kwargs = \{(.*)\}\))?\s*$")
_RETURN = re.compile(r"^#   return (.*)$", re.M)
_ORIGINAL = re.compile(r"Original ATen: \[([^\]]*)\]")
_INTERNAL = re.compile(r"^buf\d+$")        # Inductor's own buffers: partial results, not graph nodes
_RANDOM = re.compile(r"rand|bernoulli|dropout|normal|uniform|multinomial|exponential|poisson|seed")


@dataclass
class Node:
    name: str
    kind: str                  # PlaceHolder | call_function
    target: str
    args: str
    kwargs: str
    size: tuple[int, ...] | None


@dataclass
class Fragment:
    kernel: str
    nodes: dict[str, Node]
    returns: list[str]
    original: list[str]        # "aten.sub", ... (Inductor's summary of the ATen ops fused)


@dataclass
class EagerOp:
    """What replaces one kernel's launch: the lines, and the ATen ops they call (for labels)."""
    kernel: str
    launch: str                # the launch line in the file's forward
    lines: list[str]
    ops: list[str]


def fragments(code: str) -> dict[str, Fragment]:
    out: dict[str, Fragment] = {}
    for m in _BLOCK.finditer(code):
        comment, name = m.group(1), m.group(2)
        nodes: dict[str, Node] = {}
        for line in comment.splitlines():
            n = _NODE.match(line)
            if n is None:
                continue
            size = None
            if n.group(3) is not None:
                try:
                    size = tuple(int(v) for v in filter(None, (p.strip() for p in n.group(3).split(","))))
                except ValueError:
                    size = None  # a symbolic size
            nodes[n.group(1)] = Node(n.group(1), n.group(4), n.group(5), n.group(6) or "", n.group(7) or "", size)
        ret = _RETURN.search(comment)
        returns = [r.strip().lstrip("%") for r in ret.group(1).split(",")] if ret else []
        orig = _ORIGINAL.search(comment)
        original = [o.strip() for o in orig.group(1).split(",") if o.strip()] if orig else []
        out[name] = Fragment(name, nodes, returns, original)
    return out


class NotEager(Exception):
    """str() says why a kernel stays a kernel."""


def _call_text(node: Node, var: dict[str, str]) -> str:
    """`torch.ops.aten.x.y(args, kw=...)` for a node, its %refs replaced by variables."""
    def ref(m: re.Match) -> str:
        if m.group(1) not in var:
            raise NotEager(f"node {node.name} reads %{m.group(1)}, which the fragment does not define")
        return var[m.group(1)]

    args = re.sub(r"%(\w+)", ref, node.args)
    kwargs = re.sub(r"(?:^|(?<=, ))(\w+): ", r"\1=", re.sub(r"%(\w+)", ref, node.kwargs))
    if node.target == "operator.getitem":
        parts = [a.strip() for a in args.split(",")]
        text = f"{parts[0]}[{parts[1]}]"
    else:
        text = f"{node.target}({', '.join(filter(None, [args.strip(), kwargs.strip()]))})"
    try:
        ast.parse(text, mode="eval")
    except SyntaxError:
        raise NotEager(f"node {node.name}'s arguments do not read back as Python ({text[:60]})") from None
    return text


def eager_op(frag: Fragment, params: list[str], launch_args: list[str], launch_line: str,
             known: dict[str, str], sizes: dict[str, tuple], aliased: bool = False) -> EagerOp:
    """The eager lines for one kernel launch, or NotEager saying why not.

    known: graph node or graph input name -> the variable holding it in the forward.
    sizes: variable -> its size, where the forward's allocations say it.
    aliased: a view of the output buffer exists before the launch, so the result is copied into it."""
    if len(frag.returns) != 1:
        raise NotEager(f"it returns {len(frag.returns)} values")
    result = frag.returns[0]
    if _INTERNAL.match(result):
        raise NotEager("it writes a partial result of a split reduction (Inductor's own buffer)")
    outs = [i for i, p in enumerate(params) if p.startswith("out_ptr")]
    if any(p.startswith("in_out_ptr") for p in params) or len(outs) != 1:
        raise NotEager("it updates a buffer in place or writes several outputs")
    out_var = launch_args[outs[0]]
    if not re.fullmatch(r"\w+", out_var):
        raise NotEager("its output is a view of another buffer")
    order: list[str] = []
    inputs: dict[str, str] = {}

    def visit(name: str) -> None:
        if name in order or name in inputs:
            return
        node = frag.nodes.get(name)
        if node is None:
            raise NotEager(f"its fragment does not define %{name}")
        if node.kind == "PlaceHolder":
            if _INTERNAL.match(name):
                raise NotEager("it reads a partial result of a split reduction (Inductor's own buffer)")
            if name not in known:
                raise NotEager(f"no earlier step names the buffer that holds %{name}")
            if node.size is not None and sizes.get(known[name]) not in (None, node.size):
                raise NotEager(f"the buffer holding %{name} has another shape than the node")
            inputs[name] = known[name]
            return
        if node.target != "operator.getitem" and not node.target.startswith("torch.ops.aten."):
            raise NotEager(f"node {node.name} calls {node.target}, which is not an ATen op")
        if _RANDOM.search(node.target):
            raise NotEager(f"node {node.name} draws random numbers ({node.target})")
        for ref in re.findall(r"%(\w+)", node.args + " " + node.kwargs):
            visit(ref)
        order.append(name)

    visit(result)
    if not order:
        raise NotEager("it computes no ATen node of its own")
    var = {**inputs, **{n: f"_e_{n}" for n in order}}
    lines = [f"# {frag.kernel} left to eager: {', '.join(_short(frag.nodes[n].target) for n in order)}"]
    for n in order[:-1]:
        lines.append(f"{var[n]} = {_call_text(frag.nodes[n], var)}")
    last = _call_text(frag.nodes[order[-1]], var)
    lines.append(f"{out_var}.copy_(({last}).reshape({out_var}.shape))" if aliased
                 else f"{out_var} = _keep_layout({last}, {out_var})")
    ops = [_short(frag.nodes[n].target) for n in order if frag.nodes[n].target != "operator.getitem"]
    return EagerOp(frag.kernel, launch_line, lines, ops)


def _short(target: str) -> str:
    parts = target.split(".")
    return ".".join(parts[2:4]) if target.startswith("torch.ops.") else target


# Written into a file with an eager op: the next kernels index the buffer by the layout Inductor
# planned, so an eager result in another layout (or dtype) is copied into that buffer.
KEEP_LAYOUT = '''
def _keep_layout(result, planned):
    """An eager op's result where the next steps read it: itself when it has the planned buffer's
    shape, strides and dtype, else copied into the planned buffer."""
    if result.shape == planned.shape and result.stride() == planned.stride() and result.dtype == planned.dtype:
        return result
    return planned.copy_(result.reshape(planned.shape))
'''


def kept_count(source: str) -> int:
    """How many kernels a file leaves to eager ops."""
    return len(re.findall(r"^\s*# \w+ left to eager: ", source, re.M))


def apply(source: str, op: EagerOp) -> str | None:
    """`source` with `op.kernel`'s launch replaced by eager's ops, its definition, CONFIGS and launcher
    entries removed; None when the file no longer launches that kernel, or would launch none."""
    m = re.search(rf"^( *){re.escape(op.launch)}$", source, re.M)
    if m is None:
        return None
    indent = m.group(1)
    out = source[:m.start()] + "\n".join(indent + line for line in op.lines) + source[m.end():]
    if f"LAUNCHERS[{op.kernel!r}](" in out:
        return None  # launched twice: the others would still need it
    if "LAUNCHERS[" not in out.split("\nclass ModelNew(Model):", 1)[-1]:
        return None  # no kernel left: that is the reference's own forward, the Search's start
    out = re.sub(rf"^    {re.escape(repr(op.kernel))}: .*\n", "", out, flags=re.M)  # CONFIGS and LAUNCHERS rows
    start = out.find(f"@triton.jit\ndef {op.kernel}(")
    if start >= 0:  # the def runs to the next unindented line (a kernel may hold blank lines)
        nxt = re.compile(r"\n(?=\S)").search(out, out.index("\n", start + len("@triton.jit\n")))
        end = nxt.start() + 1 if nxt else len(out)
        out = out[:start] + out[end:].lstrip("\n")
    if "def _keep_layout(" not in out:
        out = out.replace("\nLAUNCHERS = {", KEEP_LAYOUT.strip("\n") + "\n\n\nLAUNCHERS = {", 1)
    return out
