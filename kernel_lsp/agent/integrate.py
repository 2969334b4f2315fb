"""Put verified op kernels back into a model, each behind a guard (caller side, no torch).

`integrated_source(...)` writes the text of a readable ``<model>_optimized.py`` that

* imports the original model file (by path, relative to itself) and subclasses its
  ``Model`` as ``ModelNew`` (so it is a KernelBench Candidate of the original Task, and
  ``REFERENCE`` points ``kernel-lsp bench`` at the original);
* for each replacement, builds the winner's ``ModelNew`` (from its file under
  ``.kernel-lsp/ops/``) with the op Task's init inputs, shares the op's parameters and
  buffers with it (same objects: ``load_state_dict`` and ``.to()`` reach both), and
  replaces the op instance's ``forward`` with a guard;
* the guard calls the kernel only for inputs like those it was verified on: the same
  number and kinds of arguments, equal constants, and per tensor the same shape, dtype and
  device type, contiguous, no autograd and eval mode (kernels are verified under ``no_grad``,
  in eval mode: the op Tasks declare ``MODE = "eval"``); anything else runs the original
  forward. If the kernel raises, the guard warns once (``warnings.warn``) and runs the
  original from then on.

The generated file imports nothing from kernel_lsp: it is the user's to keep.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Replacement:
    """One op's winner, and the inputs it was verified on."""

    op: str                              # the submodule's qualified name in Model
    kernel_path: str                     # the winner's file (defines ModelNew)
    init_inputs: list[Any]               # the op Task's get_init_inputs()
    args: list[dict[str, Any]]           # per positional argument: {"tensor": {...}} or {"const": v}
    kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    share: float = 0.0
    speedup: float | None = None
    label: str = ""                      # "custom kernel" | "PyTorch rewrite"


def guard_rule(call: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The guard's rule from a captured call (engine/worker/extract.py's `call` record)."""

    def one(spec: dict[str, Any]) -> dict[str, Any]:
        if spec["kind"] == "tensor":
            return {"tensor": {"shape": list(spec["shape"]), "dtype": spec["dtype"], "device": spec["device"]}}
        if spec["kind"] == "dtype":
            return {"dtype": spec["value"]}
        value = spec.get("value")
        return {"const": tuple(value) if spec.get("tuple") else value}

    return [one(a) for a in call.get("args", [])], {k: one(v) for k, v in call.get("kwargs", {}).items()}


def _rel(path: str, start: str) -> str:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(start))
    return rel.replace(os.sep, "/")


def _literal(value: Any) -> str:
    """A Python literal for a JSON-ish value (tuples kept, floats exact)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


RUNTIME = '''
_HERE = os.path.dirname(os.path.abspath(__file__))
_LOADED = {}


def _load(relpath):
    """A Python file beside this one (or under it), imported once by path."""
    path = os.path.normpath(os.path.join(_HERE, relpath))
    if path not in _LOADED:
        name = "klsp_" + "".join(c if c.isalnum() else "_" for c in relpath)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[path] = module
    return _LOADED[path]


def _tensor_pairs(op, kernel):
    """(owner, attribute) pairs of the kernel's tensors and the op's tensors of the same name
    (the op Task held the op as `self.op`, so a kernel's `op.weight` is the op's `weight`)."""
    pairs = []
    for full, tensor in list(kernel.named_parameters()) + list(kernel.named_buffers()):
        name = full[3:] if full.startswith("op.") else full
        try:
            theirs = op.get_parameter(name) if isinstance(tensor, torch.nn.Parameter) else op.get_buffer(name)
        except AttributeError:
            continue
        if theirs.shape == tensor.shape and theirs.dtype == tensor.dtype:
            k_owner, _, k_attr = full.rpartition(".")
            o_owner, _, o_attr = name.rpartition(".")
            pairs.append((kernel.get_submodule(k_owner), k_attr, op.get_submodule(o_owner), o_attr))
    return pairs


class _Guarded:
    """The op's forward: the kernel for inputs like those it was verified on, else the original."""

    def __init__(self, name, module, kernel, pairs, args, kwargs):
        self.name = name
        self.module = module
        self.original = module.forward
        self.kernel = kernel
        self.pairs = pairs
        self.args = args
        self.kwargs = kwargs
        self.kernel_calls = 0
        self.original_calls = 0
        self.failed = None

    @staticmethod
    def _like(value, rule):
        if "tensor" in rule:
            t = rule["tensor"]
            return (isinstance(value, torch.Tensor) and list(value.shape) == t["shape"]
                    and str(value.dtype) == t["dtype"] and value.device.type == t["device"]
                    and value.is_contiguous() and not (torch.is_grad_enabled() and value.requires_grad))
        if "dtype" in rule:
            return str(value) == rule["dtype"]
        return not isinstance(value, torch.Tensor) and value == rule["const"]

    def verified_for(self, args, kwargs):
        if self.failed is not None or len(args) != len(self.args) or set(kwargs) != set(self.kwargs):
            return False
        if torch.is_grad_enabled():
            return False  # verified under no_grad: training runs the original op
        if self.module.training:
            return False  # verified in eval mode (the op Task declares MODE = "eval")
        return (all(self._like(v, r) for v, r in zip(args, self.args))
                and all(self._like(kwargs[k], r) for k, r in self.kwargs.items()))

    def __call__(self, *args, **kwargs):
        if self.verified_for(args, kwargs):
            tensors = [v for v, r in zip(args, self.args) if "tensor" in r]
            tensors += [kwargs[k] for k, r in self.kwargs.items() if "tensor" in r]
            try:
                for k_owner, k_attr, o_owner, o_attr in self.pairs:
                    mine = getattr(o_owner, o_attr)
                    if getattr(k_owner, k_attr) is not mine:  # .to() replaced a buffer: share it again
                        setattr(k_owner, k_attr, mine)
                if isinstance(self.kernel, torch.nn.Module) and self.kernel.training != self.module.training:
                    self.kernel.train(self.module.training)
                out = self.kernel(*tensors)
                self.kernel_calls += 1
                return out
            except Exception as exc:  # a kernel fault must not take the model down
                self.failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"kernel-lsp: the kernel for `{self.name}` raised ({self.failed}); "
                              "running the original op from now on", RuntimeWarning, stacklevel=2)
        self.original_calls += 1
        return self.original(*args, **kwargs)


def _install(model, op, kernel, init_inputs, args, kwargs, **facts):
    """Replace submodule `op`'s forward with a guard around the kernel file's ModelNew."""
    module = model.get_submodule(op)
    new = _load(kernel).ModelNew(*init_inputs)
    pairs = _tensor_pairs(module, new)
    for k_owner, k_attr, o_owner, o_attr in pairs:
        setattr(k_owner, k_attr, getattr(o_owner, o_attr))  # the same objects: one set of weights
    guard = _Guarded(op, module, new, pairs, args, kwargs)
    module.forward = guard
    return guard
'''


def integrated_source(model_path: str, out_path: str, replacements: list[Replacement],
                      summary: list[str] | None = None) -> str:
    """The text of the integrated model, for a file at `out_path` (paths are relative to it)."""
    here = os.path.dirname(os.path.abspath(out_path))
    model_rel = _rel(model_path, here)
    stem = os.path.splitext(os.path.basename(model_path))[0]
    lines = [
        f'"""{os.path.basename(out_path)}: {os.path.basename(model_path)} with {len(replacements)} op(s) '
        "replaced by verified kernels, each behind a guard.",
        "",
        f"Written by `kernel-lsp optimize {os.path.basename(model_path)} --whole-model`. A replacement runs only",
        "on inputs like those it was verified on (shapes, dtype, device, contiguous, no autograd);",
        "anything else runs the original op. A kernel that raises is dropped for good, with one warning.",
        "",
        *(summary or []),
        '"""',
        "",
        "import importlib.util",
        "import os",
        "import warnings",
        "",
        "import torch",
        "",
        f"REFERENCE = {_literal(model_rel)}  # the original model: `kernel-lsp bench` compares against it",
        RUNTIME.rstrip("\n"),
        "",
        "",
        f"_original = _load({_literal(model_rel)})",
        "",
        "# op: the submodule; kernel: the winner of its Search; args/kwargs: the inputs it was verified on.",
        "REPLACEMENTS = [",
    ]
    for r in replacements:
        facts = f"{100 * r.share:.1f}% of forward"
        if r.speedup:
            facts += f", {r.speedup:.2f}x faster alone"
        if r.label:
            facts += f" ({r.label})"
        lines += [
            f"    # {r.op}: {facts}",
            "    {",
            f"        \"op\": {_literal(r.op)},",
            f"        \"kernel\": {_literal(_rel(r.kernel_path, here))},",
            f"        \"init_inputs\": {_literal(r.init_inputs)},",
            f"        \"args\": {_literal(r.args)},",
            f"        \"kwargs\": {_literal(r.kwargs)},",
            "    },",
        ]
    lines += [
        "]",
        "",
        "",
        "class ModelNew(_original.Model):",
        f'    """{stem}.Model with the REPLACEMENTS installed; `self.kernel_lsp_guards` counts their calls."""',
        "",
        "    def __init__(self, *args, **kwargs):",
        "        super().__init__(*args, **kwargs)",
        "        guards = {r[\"op\"]: _install(self, **r) for r in REPLACEMENTS}",
        "        object.__setattr__(self, \"kernel_lsp_guards\", guards)  # not a submodule: no state_dict entries",
        "",
        "",
        "get_inputs = _original.get_inputs",
        "get_init_inputs = _original.get_init_inputs",
        "",
    ]
    return "\n".join(lines)
