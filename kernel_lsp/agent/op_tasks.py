"""Which submodules of a profiled model are its hot ops, and each op as a KernelBench Task
(caller side, no torch; the extraction they read comes from engine/worker/extract.py).

* `select_ops`: from the top, a submodule above ``min_share`` of the time is an op when it is
  a leaf or spends ``min_share`` (and a third of its time) in its own code; otherwise its
  children are looked at;
* `op_task_source`: the text of an op's Task (``.kernel-lsp/ops/<model>_<op>.py``);
* `split_budget`: proposals per op by share.
"""

from __future__ import annotations

import os
import re
from typing import Any


def _modules(extraction: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in extraction.get("modules", [])}


def forward_us(extraction: dict[str, Any]) -> float:
    """The whole forward's time (the root module's inclusive time), in microseconds."""
    mods = _modules(extraction)
    return float(extraction.get("total_us") or mods.get("", {}).get("inclusive_us") or 0.0)


def self_us(mods: dict[str, dict[str, Any]], name: str) -> float:
    m = mods[name]
    return max(0.0, m["inclusive_us"] - sum(mods[c]["inclusive_us"] for c in m["children"] if c in mods))


def unattributed_share(extraction: dict[str, Any]) -> float | None:
    """The share of forward spent in Model.forward's own code (no submodule)."""
    mods, total = _modules(extraction), forward_us(extraction)
    if "" not in mods or total <= 0:
        return None
    return round(self_us(mods, "") / total, 4)


def select_ops(extraction: dict[str, Any], min_share: float) -> list[dict[str, Any]]:
    """The hot submodules, hottest first, each with its `share` (see the module docstring)."""
    mods, total = _modules(extraction), forward_us(extraction)
    if total <= 0 or "" not in mods:
        return []
    chosen: list[dict[str, Any]] = []

    def visit(name: str) -> None:
        m = mods[name]
        share = m["inclusive_us"] / total
        if not m["calls"] or share < min_share:
            return
        own = self_us(mods, name)
        # A module whose own code (not its children) is hot is taken whole (an attention's matmuls
        # and softmax); a third of its time at least, so a container's call overhead is not enough.
        if m["leaf"] or (own / total >= min_share and own >= m["inclusive_us"] / 3):
            chosen.append({**m, "share": share})
            return
        for child in m["children"]:
            if child in mods:
                visit(child)

    for child in mods[""]["children"]:
        visit(child)
    return sorted(chosen, key=lambda m: -m["share"])


def not_extractable(op: dict[str, Any]) -> str:
    """Why an op cannot become a Task by itself ('' when it can)."""
    call = op.get("call")
    if not call:
        return "its call was not captured"
    specs = list(call["args"]) + list(call["kwargs"].values())
    other = [s.get("type", "?") for s in specs if s["kind"] == "other"]
    if other:
        return f"it takes arguments a Task cannot make ({', '.join(sorted(set(other)))})"
    if not any(s["kind"] == "tensor" for s in specs):
        return "it takes no tensor"
    return ""


def split_budget(shares: list[float], total: int, minimum: int = 1) -> list[int]:
    """Proposals per op by share: `minimum` each, the rest by largest remainder, hottest first."""
    n = len(shares)
    if n == 0:
        return []
    minimum = max(1, minimum)
    weight = sum(shares) or 1.0
    extra = max(0, total - n * minimum)
    raw = [extra * s / weight for s in shares]
    out = [minimum + int(r) for r in raw]
    left = max(0, total - sum(out))
    order = sorted(range(n), key=lambda i: (-(raw[i] - int(raw[i])), -shares[i]))
    for i in order[:left]:
        out[i] += 1
    return out


# -- 3. a Task per op -------------------------------------------------------------------------

def op_file_stem(model_path: str, op_name: str) -> str:
    return f"{os.path.splitext(os.path.basename(model_path))[0]}_{re.sub(r'[^0-9A-Za-z]+', '_', op_name)}"


def _tensor_maker(spec: dict[str, Any]) -> str:
    shape = tuple(spec["shape"])
    dtype = spec["dtype"]
    if dtype == "torch.bool":
        return f"torch.rand({shape!r}) > 0.5"
    if any(k in dtype for k in ("int", "uint")):
        lo, hi = int(spec.get("min", 0)), int(spec.get("max", 9))
        return f"torch.randint({lo}, {hi + 1}, {shape!r}, dtype={dtype})"
    text = f"torch.randn({shape!r}, dtype={dtype})"
    if spec.get("min") is not None and spec["min"] >= 0:
        text += ".abs()"  # the model feeds it non-negative values (after a ReLU, a softmax...)
    return text


def _const(spec: dict[str, Any]) -> str:
    if spec["kind"] == "dtype":
        return spec["value"]
    value = spec.get("value")
    return repr(tuple(value)) if spec.get("tuple") else repr(value)


def op_task_source(op: dict[str, Any], model_path: str, task_path: str, extraction: dict[str, Any],
                   atol: float | None = None, rtol: float | None = None) -> str:
    """A KernelBench Task for one op: Model holds the op as `self.op`, forward passes the
    captured constants, get_inputs makes fresh tensors of the captured shapes."""
    call = op["call"]
    cls = op["class"]
    init = op.get("init")
    rel = os.path.relpath(os.path.abspath(model_path), os.path.dirname(os.path.abspath(task_path)))
    rel = rel.replace(os.sep, "/")
    model_name = os.path.basename(model_path)

    params: list[str] = []
    call_args: list[str] = []
    inputs: list[str] = []
    for i, spec in enumerate(call["args"]):
        if spec["kind"] == "tensor":
            params.append(f"x{i}")
            call_args.append(f"x{i}")
            inputs.append(_tensor_maker(spec))
        else:
            call_args.append(_const(spec))
    for key, spec in call["kwargs"].items():
        if spec["kind"] == "tensor":
            params.append(key)
            call_args.append(f"{key}={key}")
            inputs.append(_tensor_maker(spec))
        else:
            call_args.append(f"{key}={_const(spec)}")

    needs_original = True
    if init is not None and cls["where"] in ("torch.nn", "model_file", "importable"):
        init_names = [n for n, _ in init["args"]]
        init_values = [v for _, v in init["args"]]
        ctor = {"torch.nn": f"nn.{cls['name']}", "model_file": f"_original().{cls['name']}",
                "importable": cls["name"]}[cls["where"]]
        build = f"{ctor}({', '.join(f'{n}={n}' for n in init_names)})"
        needs_original = cls["where"] == "model_file"
    else:
        init_names, init_values = [], []
        build = f"_original_submodule({op['name']!r})"

    shapes = ", ".join("x".join(map(str, s["shape"])) + " " + s["dtype"].replace("torch.", "")
                       for s in list(call["args"]) + list(call["kwargs"].values()) if s["kind"] == "tensor")
    time_kind = extraction.get("time", "cpu")
    lines = [
        f'"""Op `{op["name"]}` ({cls["name"]}) of {model_name}: {100 * op["share"]:.1f}% of forward\'s '
        f"{time_kind} time on {extraction.get('device_name', extraction.get('device', '?'))}",
        f"({op['calls']} call{'s' * (op['calls'] != 1)} per forward; inputs {shapes}).",
        "",
        "Extracted by `kernel-lsp optimize --whole-model` as a KernelBench Task: Model holds the op as",
        "`self.op` and passes the constants it was called with; get_inputs() makes fresh tensors of the",
        "shapes it saw. Parameters built constant (a LayerNorm's ones and zeros) are varied, so a kernel",
        "that ignores them fails here. Bench or optimize it like any Task.",
        '"""',
        "",
        "import copy" if not init_names and needs_original else None,
        "import importlib.util" if needs_original else None,
        "import os" if needs_original else None,
        "import sys" if needs_original else None,
        "",
        "import torch",
        "import torch.nn as nn",
        f"from {cls['module']} import {cls['name']}" if cls["where"] == "importable" and init is not None else None,
        "",
        f"ATOL = {atol!r}" if atol is not None else None,
        f"RTOL = {rtol!r}" if rtol is not None else None,
        "# The whole-model flow profiles the model in eval mode and its guard runs a kernel only",
        "# under no_grad in eval mode: an inference Task (training mode is not verified).",
        'MODE = "eval"',
    ]
    if needs_original:
        lines += [
            f"SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), {rel!r})",
            "SEED = 42  # the engine's seed: the model built here is the one that was profiled",
            "_ORIGINAL = []",
            "",
            "",
            "def _original():",
            f'    """{model_name}, imported once by path."""',
            "    if not _ORIGINAL:",
            f"        spec = importlib.util.spec_from_file_location({'klsp_source_' + re.sub(r'[^0-9A-Za-z]', '_', model_name)!r}, SOURCE)",
            "        module = importlib.util.module_from_spec(spec)",
            "        sys.modules[spec.name] = module  # torch.compile looks classes' modules up by name",
            "        spec.loader.exec_module(module)",
            "        _ORIGINAL.append(module)",
            "    return _ORIGINAL[0]",
        ]
        if not init_names:
            lines += [
                "",
                "",
                "def _original_submodule(name):",
                '    """The op as the model builds it (its constructor arguments are not plain values)."""',
                "    m = _original()",
                "    with torch.random.fork_rng(devices=[]):",
                "        torch.manual_seed(SEED)",
                "        model = m.Model(*m.get_init_inputs())",
                "    return copy.deepcopy(model.get_submodule(name))",
            ]
    lines += [
        "",
        "",
        "def _vary_constant_parameters(module):",
        "    gen = torch.Generator().manual_seed(0)",
        "    with torch.no_grad():",
        "        for p in module.parameters():",
        "            if p.is_floating_point() and p.numel() > 1 and bool((p == p.flatten()[0]).all()):",
        "                p.add_(0.1 * torch.randn(p.shape, generator=gen).to(p.dtype))",
        "",
        "",
        "class Model(nn.Module):",
        f"    def __init__(self{''.join(', ' + n for n in init_names)}):",
        "        super().__init__()",
        f"        self.op = {build}",
        "        _vary_constant_parameters(self.op)",
        "",
        f"    def forward(self{''.join(', ' + p for p in params)}):",
        f"        return self.op({', '.join(call_args)})",
        "",
        "",
        "def get_inputs():",
        "    return [" + ", ".join(inputs) + "]",
        "",
        "",
        "def get_init_inputs():",
        f"    return {init_values!r}",
        "",
    ]
    return "\n".join(line for line in lines if line is not None)
