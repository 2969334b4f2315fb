"""torch.compile's compile of the reference without running it, so that the GPU's turn can go
to another process meanwhile (protocol.TURN_CPU_START / TURN_CPU_END).

Compiling is CPU work: dynamo traces with fake tensors and Inductor writes and compiles its
Triton kernels; nothing runs on the GPU until a compiled graph is called. `DryRun` is Inductor
for the same mode (the backend `torch.compile(mode=...)` makes), whose graphs raise `NotRun`
when called before `live` is set: the first call compiles the first graph and stops there.
Once live, the same compiled module runs as torch.compile's would; the one Python call it adds
per graph is host time, which the timing's lead hides (worker/timing/bench.py). A graph after a graph
break compiles at its first live call, inside the turn, as before. Only the default mode: the
others compile inside the turn (why_not). $KERNEL_LSP_LEND_COMPILE=0 turns it off.
"""

from __future__ import annotations

from typing import Any


# "0" turns it off: torch.compile then compiles inside the GPU's turn, as before.
OFF_ENV = "KERNEL_LSP_LEND_COMPILE"


class NotRun(Exception):
    """A compiled graph was called before the compile's span ended: nothing ran."""


def why_not(mode: str) -> str:
    """Why this mode does not compile without the GPU ("" when it does): max-autotune times
    candidate kernels on the GPU while it compiles; reduce-overhead's CUDA graphs are kept to
    the plain path until measured on a GPU."""
    if (mode or "default") != "default":
        return f"mode {mode} compiles inside the GPU's turn"
    return ""


class DryRun:
    """A torch.compile backend: Inductor as `torch.compile(mode=mode)` has it, its graphs held
    back until `live`."""

    def __init__(self, mode: str) -> None:
        import torch

        self.inner = torch._TorchCompileInductorWrapper(None if mode == "default" else mode, None, None)
        self.live = False
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        fn = self.inner(gm, example_inputs)
        self.graphs += 1

        def graph(*args: Any) -> Any:
            if not self.live:
                raise NotRun
            return fn(*args)

        # dynamo calls a boxed graph with one list (Inductor's are): the same convention
        graph._boxed_call = getattr(fn, "_boxed_call", False)  # type: ignore[attr-defined]
        return graph

    def __getattr__(self, name: str) -> Any:  # get_compiler_config, reset: Inductor's own
        return getattr(self.inner, name)
