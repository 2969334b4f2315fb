"""Where a model's forward spends its time, per submodule, and what each
submodule was called with (the Worker op ``extract``).

The model is the Task's reference (``Model(*get_init_inputs())`` under the seed, in eval
mode), run on its real inputs: ``kernel_lsp_inputs()`` when the file defines it, else
``get_inputs()``. Two passes:

1. capture: forward pre-hooks record each submodule's first call (tensor arguments as
   shape/dtype/device/contiguity/value range, everything else as a constant when it is
   plain JSON), and how often it was called; its constructor's arguments were recorded
   while the model was built (each ``nn.Module`` subclass's ``__init__`` wrapped for that
   moment only);
2. time: on CUDA a ``torch.profiler`` run with one ``record_function`` range per submodule
   call, so each submodule's inclusive time is its range's device time (its kernels and its
   children's), summed over its calls and averaged over the profiled forwards; on the CPU a
   clock read around each call (the profiler's per-op cost would inflate modules made of
   many small ops), the median of several forwards.

The result is plain JSON; the caller (``agent/whole_model.py``) picks the hot ops and
writes a Task for each. Nothing here writes files.
"""

from __future__ import annotations

import inspect
import math
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from kernel_lsp.engine.worker.harness import Harness, to_device
from kernel_lsp.model import Task

RANGE = "kernel_lsp.module::"
_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    """A constant that a Task file can spell as a Python literal."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return False


def describe(value: Any) -> dict[str, Any]:
    """One argument: a tensor's spec, a plain constant, or why it cannot be extracted."""
    if isinstance(value, torch.Tensor):
        spec: dict[str, Any] = {"kind": "tensor", "shape": list(value.shape), "dtype": str(value.dtype),
                                "device": value.device.type, "contiguous": bool(value.is_contiguous()),
                                "requires_grad": bool(value.requires_grad)}
        if value.numel() and not value.is_complex():
            with torch.no_grad():
                lo, hi = value.min().item(), value.max().item()
            spec["min"], spec["max"] = (float(lo), float(hi)) if value.is_floating_point() else (int(lo), int(hi))
        return spec
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "value": str(value)}
    if _plain(value):
        return {"kind": "const", "value": list(value) if isinstance(value, tuple) else value,
                "tuple": isinstance(value, tuple)}
    return {"kind": "other", "type": type(value).__name__}


def _class_info(module: torch.nn.Module, ref_module: Any) -> dict[str, Any]:
    cls = type(module)
    info: dict[str, Any] = {"name": cls.__name__, "module": cls.__module__, "where": "other"}
    if getattr(torch.nn, cls.__name__, None) is cls:
        info["where"] = "torch.nn"
    elif getattr(ref_module, cls.__name__, None) is cls:
        info["where"] = "model_file"
    elif not cls.__module__.startswith("kernel_lsp_candidate_"):
        info["where"] = "importable"
    return info


def _init_info(module: torch.nn.Module) -> dict[str, Any] | None:
    """The constructor's arguments by parameter name, when all are plain constants."""
    recorded = module.__dict__.get("_kernel_lsp_init")
    if recorded is None:
        # No class of its own between it and nn.Module defines __init__: it takes no arguments.
        own = [k for k in type(module).__mro__[:-1] if issubclass(k, torch.nn.Module) and k is not torch.nn.Module
               and "__init__" in k.__dict__]
        return None if own else {"args": []}
    args, kwargs = recorded
    try:
        bound = inspect.signature(type(module).__init__).bind(module, *args, **kwargs)
    except (TypeError, ValueError):
        return None
    named: list[list[Any]] = []
    for name, value in list(bound.arguments.items())[1:]:
        kind = inspect.signature(type(module).__init__).parameters[name].kind
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return None
        if not _plain(value):
            return None
        named.append([name, list(value) if isinstance(value, tuple) else value])
    return {"args": named}


@contextmanager
def recording_init() -> Iterator[None]:
    """While building the model: every nn.Module subclass's __init__ notes its arguments on
    the instance (the outermost class's call wins: the one the model's code wrote)."""
    patched: list[tuple[type, Any]] = []
    seen: set[type] = set()
    stack = list(torch.nn.Module.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        if "__init__" not in cls.__dict__:
            continue
        original = cls.__dict__["__init__"]

        def wrapper(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            if "_kernel_lsp_init" not in self.__dict__:
                self.__dict__["_kernel_lsp_init"] = (args, kwargs)
            __original(self, *args, **kwargs)

        try:
            wrapper.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        cls.__init__ = wrapper  # type: ignore[method-assign]
        patched.append((cls, original))
    try:
        yield
    finally:
        for cls, original in patched:
            cls.__init__ = original  # type: ignore[method-assign]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_cuda(model: torch.nn.Module, inputs: list[Any], names: dict[int, str], device: torch.device,
               calls: int) -> dict[str, float]:
    """Device time per submodule: one profiler range per call, its kernels' time (children's included)."""
    open_ranges: list[Any] = []

    def enter(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        rf = torch.autograd.profiler.record_function(RANGE + names.get(id(mod), "?"))
        rf.__enter__()
        open_ranges.append(rf)

    def leave(mod: torch.nn.Module, args: tuple[Any, ...], result: Any) -> None:
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    from torch.profiler import ProfilerActivity, profile

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    hooks += [m.register_forward_hook(leave) for m in model.modules()]
    try:
        with torch.no_grad():
            model(*inputs)  # warm-up: lazy init, cuBLAS handles, autotuning
            _sync(device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    model(*inputs)
                _sync(device)
    finally:
        for hk in hooks:
            hk.remove()
    inclusive: dict[str, float] = {}
    cpu = torch.autograd.DeviceType.CPU
    for evt in prof.events():
        # The CPU-side range only: the trace also holds a GPU-side copy of each range (its span).
        if evt.name.startswith(RANGE) and getattr(evt, "device_type", cpu) == cpu:
            name = evt.name[len(RANGE):]
            inclusive[name] = inclusive.get(name, 0.0) + float(evt.device_time_total) / calls
    if inclusive.get("", 0.0) <= 0:  # kernels not attributed to ranges: CUDA events around each call
        return _time_cuda_events(model, inputs, names, device, calls)
    return inclusive


def _time_cuda_events(model: torch.nn.Module, inputs: list[Any], names: dict[int, str], device: torch.device,
                      calls: int) -> dict[str, float]:
    marks: list[tuple[str, Any, Any]] = []
    starts: list[Any] = []

    def enter(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        starts.append(ev)

    def leave(mod: torch.nn.Module, args: tuple[Any, ...], result: Any) -> None:
        if starts:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            marks.append((names.get(id(mod), "?"), starts.pop(), end))

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    hooks += [m.register_forward_hook(leave) for m in model.modules()]
    try:
        with torch.no_grad():
            for _ in range(calls):
                model(*inputs)
        _sync(device)
    finally:
        for hk in hooks:
            hk.remove()
    inclusive: dict[str, float] = {}
    for name, a, b in marks:
        inclusive[name] = inclusive.get(name, 0.0) + a.elapsed_time(b) * 1e3 / calls
    return inclusive


def _time_cpu(model: torch.nn.Module, inputs: list[Any], names: dict[int, str], calls: int) -> dict[str, float]:
    """CPU time per submodule from a clock read around each call (the profiler's own cost per op
    would inflate modules made of many small ops); the median forward of `calls`."""
    starts: list[float] = []
    per_call: dict[str, float] = {}

    def enter(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        starts.append(time.perf_counter())

    def leave(mod: torch.nn.Module, args: tuple[Any, ...], result: Any) -> None:
        if starts:
            name = names.get(id(mod), "?")
            per_call[name] = per_call.get(name, 0.0) + (time.perf_counter() - starts.pop()) * 1e6

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    hooks += [m.register_forward_hook(leave) for m in model.modules()]
    runs: list[dict[str, float]] = []
    try:
        with torch.no_grad():
            model(*inputs)  # warm-up
            for _ in range(max(calls, 5)):
                per_call.clear()
                starts.clear()
                model(*inputs)
                runs.append(dict(per_call))
    finally:
        for hk in hooks:
            hk.remove()
    runs.sort(key=lambda r: r.get("", 0.0))
    return runs[len(runs) // 2]


def extract(task: Task, options: dict[str, Any], builder: Any) -> dict[str, Any]:
    """The model's submodules with their inclusive time, first call's arguments and
    constructor arguments (see the module docstring)."""
    device = torch.device(options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    seed = int(options.get("seed", 42))
    calls = max(1, int(options.get("profile_calls", 3)))
    h = Harness(task, None, builder, device=device, seed=seed)
    ref = h.load_reference()
    with recording_init():
        model = h.build_model()
    custom = getattr(ref, "kernel_lsp_inputs", None)
    if callable(custom):
        from kernel_lsp.engine.worker.harness import set_seed

        set_seed(seed)
        inputs = [to_device(v, device) for v in custom()]
        source = "kernel_lsp_inputs()"
    else:
        inputs = h.make_inputs(seed).values
        source = "get_inputs()"

    names = {id(m): n for n, m in model.named_modules()}
    first: dict[str, dict[str, Any]] = {}
    count: dict[str, int] = {}

    def capture(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        name = names.get(id(mod))
        if name is None:
            return
        count[name] = count.get(name, 0) + 1
        if name not in first:
            first[name] = {"args": [describe(a) for a in args],
                           "kwargs": {k: describe(v) for k, v in kwargs.items()}}

    hooks = [m.register_forward_pre_hook(capture, with_kwargs=True) for m in model.modules()]
    try:
        with torch.no_grad():
            out = model(*inputs)
        _sync(device)
    finally:
        for hk in hooks:
            hk.remove()
    output = describe(out) if isinstance(out, torch.Tensor) else {"kind": "other", "type": type(out).__name__}

    on_device = device.type == "cuda"
    if on_device:
        inclusive = _time_cuda(model, inputs, names, device, calls)
    else:
        # As the bench does on a CPU: a fixed thread count (intra-op barriers on a busy machine
        # otherwise stall whole scheduler slices, and land in whichever module was running).
        threads = torch.get_num_threads()
        torch.set_num_threads(int(options.get("cpu_threads", 1)))
        try:
            inclusive = _time_cpu(model, inputs, names, calls)
        finally:
            torch.set_num_threads(threads)
    modules: list[dict[str, Any]] = []
    for name, mod in model.named_modules():
        children = [f"{name}.{c}" if name else c for c, _ in mod.named_children()]
        modules.append({
            "name": name, "parent": name.rpartition(".")[0] if name else None, "children": children,
            "class": _class_info(mod, ref), "leaf": not children, "calls": count.get(name, 0),
            "inclusive_us": inclusive.get(name, 0.0), "init": _init_info(mod),
            "call": first.get(name), "parameters": sum(p.numel() for p in mod.parameters(recurse=True)),
        })
    return {"task": task.name, "device": str(device), "time": "device" if on_device else "cpu",
            "inputs_from": source, "seed": seed, "profiled_calls": calls, "output": output,
            "total_us": inclusive.get("", 0.0), "modules": modules,
            "device_name": torch.cuda.get_device_name(device) if on_device else "cpu"}


def worker_op(params: dict[str, Any], builder: Any) -> dict[str, Any]:
    """The Worker's ``extract`` request: ``{"task": Task dict, "options": {...}}``."""
    return extract(Task.from_dict(params["task"]), dict(params.get("options") or {}), builder)
