"""Turn a Task and a Candidate into callables and input sets.

The reference module comes from `Task.reference_source` through the builder (a fresh
module per load), the Model is built under a seed, input sets are made under fresh seeds
and moved to the device, and the Candidate becomes one callable `fn(*inputs)`:

* kind "python": `ModelNew(*init_inputs)` built under the same seed as the reference
  (KernelBench's way), then the reference's state_dict copied over for every parameter or
  buffer whose name and shape match, so both hold the same weights;
* kind "cuda": the built library `lib`, called through the harness's
  `kernel_forward(lib, model, *inputs)`, else `getattr(lib, ENTRY)(*inputs)`.
"""

from __future__ import annotations

import copy
import linecache
import os
import random
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernel_lsp.model import Candidate, CompileResult, Task


class HarnessError(Exception):
    """The reference or the harness itself could not run (not the candidate's fault)."""


class CandidateError(Exception):
    """The candidate could not be turned into a callable (missing ModelNew, raising __init__)."""


# get_inputs() makes its tensors on the host (KernelBench's contract), where one CPU thread draws
# every number: torch.rand made 256 MiB in 0.38 s here (about 0.7 GB/s), so a 6 GiB softmax set
# took ~9 s, and a bench draws 5-8 sets (verify, the early and the final timing). A small set
# costs little, but an evaluation draws about 18 of them (verify's, the timing's four and the
# cache probe's eight): the editor loop's 16 MiB GELU evaluated in 0.63 s with its sets drawn on
# the GPU against 1.09 s on the host (H100, benchmarks/eval_profile.py). From this size of a set
# on, on a GPU, the sets are drawn on the GPU (microseconds a set): the same distributions and a
# fixed seed, so verdicts and timings are unchanged.
DEVICE_INPUTS_BYTES = 1 << 20
# ... and from this size on, a note says so (where a host draw would have cost seconds).
NOTE_INPUTS_BYTES = 256 << 20
HOST_DRAW_BYTES_PER_S = 0.7e9


def set_seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    try:
        import numpy as np  # optional: only seeded when present

        np.random.seed(seed % (2**32))
    except ImportError:
        pass


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


def clone_inputs(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]


def flat_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat_tensors(v)]
    return []


def tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in flat_tensors(value))


@dataclass
class InputSet:
    seed: int
    values: list[Any]
    zero_float_inputs: list[int] = field(default_factory=list)  # indices of all-zero float tensors


class Harness:
    """One Task (and optionally one Candidate) made runnable on one device."""

    def __init__(self, task: Task, candidate: Candidate | None, builder: Any,
                 device: str | torch.device = "cpu", seed: int = 42,
                 build_options: Any = None) -> None:
        self.task = task
        self.candidate = candidate
        self.builder = builder
        self.device = torch.device(device)
        self.seed = int(seed)
        self.build_options = build_options
        self.ref_module: types.ModuleType | None = None
        self.model: torch.nn.Module | None = None
        self.init_inputs: list[Any] = []
        self.candidate_fn: Callable[..., Any] | None = None
        self.candidate_module: Any = None
        # The nn.Module behind candidate_fn, if any (ModelNew, or kernel_forward's Model copy):
        # verify switches its mode and puts its state back between training-mode calls.
        self.candidate_model: torch.nn.Module | None = None
        # Where get_inputs() draws: None until the first set (then _draw_on_device decides).
        self.inputs_on_device: bool | None = None
        self.inputs_note: str | None = None

    # -- reference -------------------------------------------------------------------
    def load_reference(self) -> types.ModuleType:
        _register_source(self.task.reference_path, self.task.reference_source)
        try:
            module, result = self.builder.load_python(self.task.reference_source, self.task.reference_path)
        except Exception as exc:  # a broken reference is a harness error, reported, not raised on
            raise HarnessError(f"reference failed to load: {type(exc).__name__}: {exc}") from exc
        if module is None:
            raise HarnessError(f"reference failed to load: {_first_line(result.log) if result else ''}")
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, name):
                raise HarnessError(f"reference has no `{name}`")
        self.ref_module = module
        return module

    def _init_inputs(self) -> list[Any]:
        assert self.ref_module is not None
        set_seed(self.seed)
        return list(self.ref_module.get_init_inputs())

    def build_model(self) -> torch.nn.Module:
        """The reference Model under the seed, on the device, in eval mode."""
        if self.ref_module is None:
            self.load_reference()
        assert self.ref_module is not None
        try:
            self.init_inputs = self._init_inputs()
            set_seed(self.seed)
            model = self.ref_module.Model(*self.init_inputs)
            model = model.to(self.device).eval()
        except Exception as exc:
            raise HarnessError(f"reference Model(*get_init_inputs()) failed: {type(exc).__name__}: {exc}") from exc
        self.model = model
        return model

    def make_inputs(self, seed: int) -> InputSet:
        """get_inputs() under `seed`, on the device; all-zero float inputs are noted. Large sets
        on a GPU are drawn there (see DEVICE_INPUTS_BYTES), the same numbers for the same seed."""
        values = [to_device(v, self.device) for v in self._draw(seed)]
        zeros = [i for i, v in enumerate(values)
                 if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0
                 and not bool(v.any())]
        return InputSet(seed=seed, values=values, zero_float_inputs=zeros)

    def _draw(self, seed: int) -> list[Any]:
        """get_inputs()'s values under `seed`: on the GPU when _draw_on_device says so."""
        assert self.ref_module is not None
        if self.inputs_on_device is None:
            self.inputs_on_device = self._draw_on_device()
        values = None
        if self.inputs_on_device:
            set_seed(seed)
            try:
                with torch.device(self.device):
                    values = list(self.ref_module.get_inputs())
            except Exception:  # a get_inputs that needs host tensors (numpy, .cuda()): as written
                self.inputs_on_device, self.inputs_note = False, None
                values = None
        if values is None:
            set_seed(seed)
            try:
                values = list(self.ref_module.get_inputs())
            except Exception as exc:
                raise HarnessError(f"get_inputs() failed: {type(exc).__name__}: {exc}") from exc
        return values

    def _is_gpu(self) -> bool:
        return self.device.type == "cuda"

    def _draw_on_device(self) -> bool:
        """A GPU Task whose input set is at least DEVICE_INPUTS_BYTES (sized by running
        get_inputs() on the meta device, which draws nothing) has its sets drawn on the GPU."""
        if not self._is_gpu() or self.ref_module is None:
            return False
        shapes = self._meta_inputs()
        if shapes is None:  # it cannot run on meta (numpy, .cuda(), data): drawn as written
            return False
        size = sum(t.numel() * t.element_size() for t in shapes if isinstance(t, torch.Tensor))
        if size < DEVICE_INPUTS_BYTES:
            return False
        if size < NOTE_INPUTS_BYTES:
            return True
        self.inputs_note = (f"input sets drawn on the GPU ({size / (1 << 30):.1f} GiB a set): get_inputs() ran with "
                            f"{self.device} as its default device, since drawing them on the host takes about "
                            f"{size / HOST_DRAW_BYTES_PER_S:.0f} s a set")
        return True

    def _meta_inputs(self) -> list[Any] | None:
        """get_inputs() on the meta device (shapes and dtypes, no numbers drawn); None when it
        cannot run there (numpy, .cuda(), data-dependent code)."""
        assert self.ref_module is not None
        try:
            with torch.device("meta"):
                return list(self.ref_module.get_inputs())
        except Exception:
            return None

    def meta_sizes(self) -> dict[str, Any] | None:
        """The Task's sizes without drawing a number: get_inputs(), the Model and its forward on
        the meta device. Bytes of one input set, of the outputs (taken as large as the inputs,
        `output_known` False, when the forward cannot run on meta: an .item(), numpy, a custom
        op) and of the parameters and buffers. None when get_inputs() cannot run there."""
        if self.ref_module is None:
            self.load_reference()
        inputs = self._meta_inputs()
        if inputs is None:
            return None
        input_bytes = tensor_bytes(inputs)
        param_bytes, output_bytes = 0, None
        try:
            with torch.device("meta"):
                model = self.ref_module.Model(*self.ref_module.get_init_inputs())
            if isinstance(model, torch.nn.Module):
                param_bytes = tensor_bytes(list(model.parameters()) + list(model.buffers()))
            with torch.no_grad():
                output_bytes = tensor_bytes(model(*inputs))
        except Exception:  # the Model or its forward does not run on meta: outputs estimated
            pass
        return {"input_bytes": input_bytes, "output_bytes": input_bytes if output_bytes is None else output_bytes,
                "param_bytes": param_bytes, "output_known": output_bytes is not None}

    # -- candidate -------------------------------------------------------------------
    def build_candidate(self) -> tuple[Callable[..., Any] | None, CompileResult]:
        """Build the Candidate; (None, result) when it does not build. Raises CandidateError
        when it builds but cannot be instantiated (the candidate's fault)."""
        assert self.candidate is not None
        if self.model is None:
            self.build_model()
        if self.candidate.kind == "cuda":
            return self._build_cuda()
        return self._build_python()

    def _build_python(self) -> tuple[Callable[..., Any] | None, CompileResult]:
        assert self.candidate is not None and self.model is not None
        filename = self.task.reference_path
        if self.candidate.source != self.task.reference_source:
            stem = os.path.splitext(self.task.reference_path)[0]
            filename = f"{stem}.candidate-{self.candidate.id}.py"
        _register_source(filename, self.candidate.source)
        module, result = self.builder.load_python(self.candidate.source, filename)
        if module is None:
            return None, result
        self.candidate_module = module
        cls = getattr(module, "ModelNew", None)
        if cls is None:
            raise CandidateError("the candidate defines no `ModelNew`")
        try:
            init = self._init_inputs()
            set_seed(self.seed)
            new = cls(*init)
            if isinstance(new, torch.nn.Module):
                new = new.to(self.device).eval()
                _copy_matching_state(self.model, new)
        except Exception as exc:
            raise CandidateError(f"ModelNew(*get_init_inputs()) raised {type(exc).__name__}: {exc}") from exc
        self.candidate_fn = new
        self.candidate_model = new if isinstance(new, torch.nn.Module) else None
        return new, result

    def _build_cuda(self) -> tuple[Callable[..., Any] | None, CompileResult]:
        assert self.candidate is not None and self.ref_module is not None
        filename = self.task.cuda_path or self.task.reference_path.replace(".py", ".cu")
        lib, result = self.builder.load_cuda(self.candidate.source, filename, self.build_options)
        if lib is None:
            return None, result
        self.candidate_module = lib
        forward = getattr(self.ref_module, "kernel_forward", None)
        if forward is not None:
            # The harness's own Model copy, so the kernel cannot alter the reference's weights.
            kernel_model = copy.deepcopy(self.model)
            self.candidate_model = kernel_model

            def call(*inputs: Any) -> Any:
                return forward(lib, kernel_model, *inputs)
        else:
            entry = self.task.entry or getattr(self.ref_module, "ENTRY", None)
            if not entry:
                raise HarnessError("the harness names no ENTRY and has no kernel_forward")
            fn = getattr(lib, entry, None)
            if fn is None:
                raise CandidateError(f"the built .cu exports no `{entry}`")

            def call(*inputs: Any) -> Any:
                return fn(*inputs)
        self.candidate_fn = call
        return call, result


def _register_source(filename: str, source: str) -> None:
    """Make `inspect.getsource` find text that is not on disk (or differs from it): @triton.jit
    and torch.compile read a function's source through linecache."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def _copy_matching_state(src: torch.nn.Module, dst: torch.nn.Module) -> list[str]:
    """Copy src's parameters/buffers into dst where names and shapes match; the names copied."""
    theirs = dst.state_dict()
    ours = src.state_dict()
    common = {k: v for k, v in ours.items() if k in theirs and theirs[k].shape == v.shape
              and theirs[k].dtype == v.dtype}
    if common:
        dst.load_state_dict(common, strict=False)
    return sorted(common)


def _first_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
