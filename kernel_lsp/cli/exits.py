"""One exit-status rule for every command, and the facts the commands share to apply it.

0: it did what was asked and found it good; 1: it ran and found a problem (a compile error,
a wrong kernel) or no improvement; 2: it could not run (bad input, a missing file, no GPU
for GPU work, no model configured, an endpoint it cannot reach). When one command covers
several files, a problem found (1) wins over a part that could not run (2).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from typing import Any

OK, PROBLEM, CANNOT_RUN = 0, 1, 2
CANCELLED = 130

HELP = """exit status:
  0  did what was asked and found it good
  1  ran and found a problem (compile error, wrong result) or no improvement
  2  could not run: bad input, missing file, no GPU for GPU work, no CUDA toolkit,
     GPU memory held by other processes, no model configured, endpoint unreachable
  with several files, 1 wins over 2. KERNEL_LSP_DEBUG=1 (or --debug) shows tracebacks."""

# A timing whose interquartile spread is above this (percent of the median) is too noisy to
# state as a number: it is shown as a warning. The engine's threshold, one for every front end.
from kernel_lsp.model import NOISY_SPREAD_PCT as SPREAD_WARN_PCT  # noqa: E402


try:  # the engine's type, so that its CannotRun, NoModelConfigured, EndpointUnreachable and NoGPU are ours
    from kernel_lsp.verdicts import CannotRun
except ImportError:  # pragma: no cover - an engine without kernel_lsp.verdicts
    class CannotRun(Exception):  # type: ignore[no-redef]
        """The command could not do what was asked (exit 2); the message says why."""


def combine(codes: Iterable[int]) -> int:
    codes = set(codes)
    for code in (CANCELLED, PROBLEM, CANNOT_RUN):
        if code in codes:
            return code
    return OK


def could_not_run(verdict: str | None, message: str | None) -> bool:
    """An Evaluation that says nothing about the candidate: nothing ran, or the harness
    (the reference, its inputs) failed before the candidate was reached."""
    return verdict == "not_run" or (verdict == "error" and (message or "").startswith("harness:"))


def torch_build(python: str | None) -> dict[str, Any]:
    """`torch.__version__`, `torch.version.cuda` and whether a GPU is visible, from `python`
    (the Workers' interpreter); empty when it cannot be asked."""
    import sys

    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, "
            "'cuda_build': torch.version.cuda, 'gpu': torch.cuda.is_available()}))")
    try:
        out = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        import json

        return json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def gpu_hint(message: str, python: str | None) -> str | None:
    """The real cause when CUDA code could not load: a CPU-only torch or no GPU, rather
    than the CUDA_HOME that torch's extension builder names."""
    if "CUDA_HOME" not in message and "CUDA" not in message and "cuda" not in message:
        return None
    build = torch_build(python)
    if not build:
        return None
    if not build.get("cuda_build"):
        return (f"torch {build['torch']} is a CPU-only build: CUDA code (load_inline, .cu) needs a CUDA "
                "build of torch and a GPU; nothing here is wrong with the kernel")
    if not build.get("gpu"):
        return f"torch {build['torch']} (CUDA {build['cuda_build']}) sees no GPU: CUDA code needs one to run"
    return None
