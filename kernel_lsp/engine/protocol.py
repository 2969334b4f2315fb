"""The Worker's wire format: JSON lines on a private pipe pair.

Request  ``{"id": int, "op": str, "params": {...}}``
Response ``{"id": int, "result": ...}`` or
         ``{"id": int, "error": {"type", "message", "traceback"}, "fatal": bool}``
At start the Worker sends ``{"id": null, "ready": {...}}`` once.
Partial   ``{"id": null, "partial": {...}, "request": int, "kind": str}``: what an op knows
          before its answer (an evaluate's verdict and eager ratio while torch.compile
          compiles), sent only when the request's options ask (EARLY_RESULT). Its id is null,
          so a reader that matches answers by id passes over it; the answer still follows.
Turn point ``{"id": null, "partial": {"stage": str, "turn": int}, "request": int,
          "kind": "turn_point"}``: a partial sent between an evaluate's stages when its options
          ask (YIELD_TURNS). The Worker then waits, doing nothing, for the caller's line
          ``{"continue": true, "turn": int}`` (the same turn) on its input before it goes on;
          meanwhile the caller may hand the GPU's machine-wide turn to another process, and
          then first sends ``{"release": true, "turn": int}``: the Worker hands its cached GPU
          memory back and keeps waiting.
``fatal: true`` says the Worker will exit after this response (a sticky CUDA error
poisoned its context); the client starts a fresh one for the next request.

Also here: how a dead Worker's exit status and stderr become a verdict. Stdlib only.
"""

from __future__ import annotations

import functools
import json
import signal
import traceback
from typing import Any

# The sandbox's limits, as JSON in the Worker's environment (caller/sandbox.py sets it,
# worker/fences.py reads it), and the verdict of a candidate stopped by one of them.
SANDBOX_ENV = "KERNEL_LSP_SANDBOX"
SANDBOX_VIOLATION = "sandbox_violation"

# Set by the Engine in its GPU Worker's environment ("gpu"): the Worker initializes CUDA in a
# thread while it imports, and imports the evaluation modules before it says ready
# (worker/early.py). Build-pool Workers never get it.
WORKER_ROLE_ENV = "KERNEL_LSP_WORKER_ROLE"
GPU_ROLE = "gpu"

# Errors raised inside an op that mean out of memory (the torch ones are RuntimeError subclasses).
OOM_TYPES = {"MemoryError", "OutOfMemoryError", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"}
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda_error_out_of_memory", "memoryerror", "std::bad_alloc")
ILLEGAL_ACCESS_MARKERS = ("illegal memory access", "cuda_error_illegal_address", "illegal address")
# CUDA errors after which the context is unusable: the Worker must exit.
STICKY_CUDA_MARKERS = (
    "illegal memory access",
    "illegal address",
    "misaligned address",
    "unspecified launch failure",
    "device-side assert",
    "illegal instruction",
    "an illegal instruction",
    "cuda error: an invalid program counter",
    "hardware stack error",
    "launch timed out",
)


def encode(message: dict[str, Any]) -> bytes:
    # allow_nan: Timing may carry inf/nan; Python's json reads them back.
    return (json.dumps(message, separators=(",", ":"), default=_default) + "\n").encode("utf-8")


def decode(line: bytes | str) -> dict[str, Any]:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError(f"protocol message is not an object: {str(line)[:200]!r}")
    return data


def _default(obj: Any) -> Any:
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return repr(obj)


def request(req_id: int, op: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": req_id, "op": op, "params": params or {}}


# -- partial results (in-op notifications) -------------------------------------------------------
# An evaluate whose options carry EARLY_RESULT: true sends one "evaluation" partial once the
# verdict is known and the candidate and eager are timed, when torch.compile's baseline is still
# to be compiled (none kept). It is shown until the answer replaces it; never stored.
EARLY_RESULT = "early_result"
PARTIAL_EVALUATION = "evaluation"


def partial(req_id: Any, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": None, "partial": data, "request": req_id, "kind": kind}


def is_partial(message: dict[str, Any]) -> bool:
    return message.get("id") is None and isinstance(message.get("partial"), dict)


# The Worker's torch.compile threads (caller/process.py sets TORCHINDUCTOR_COMPILE_THREADS=1 unless the
# user did): "1" in this variable says the number is the engine's, so a max-autotune compile may
# raise it (worker/inductor_code.mode_threads); absent, the user's number stands.
COMPILE_THREADS_CHOSEN_ENV = "KERNEL_LSP_COMPILE_THREADS_CHOSEN"


# -- turn points (bounded GPU turns) ---------------------------------------------------------------
# An evaluate whose options carry YIELD_TURNS: true (the Engine sets it when it holds the GPU's
# machine-wide turn, caller/gpu_lock.py) stops at safe points between its stages (after verify,
# after the early timing, after torch.compile's compilation; never inside a timing run or a
# tamper-check window) and sends a TURN_POINT partial; it goes on once the caller writes
# `resume(turn)`. The caller hands the GPU to a waiting process first when one waits. A caller
# that does not ask never gets one; a continue line the Worker's loop meets between requests
# (a stale one) is skipped.
YIELD_TURNS = "yield_turns"
PARTIAL_TURN_POINT = "turn_point"
# Two turn points around a span of CPU work that needs no GPU (torch.compile compiling the
# reference, nothing run: worker/timing/dry_compile.py): at the first the caller may lend the GPU to a
# waiting process and answers at once; at the second it takes the GPU back (queued at its
# target) before it answers, so the Worker never runs on the GPU without the turn.
TURN_CPU_START = "compile_cpu"
TURN_CPU_END = "compile_cpu_done"


def resume(turn: Any) -> dict[str, Any]:
    """The caller's answer to a turn point: go on."""
    return {"continue": True, "turn": turn}


def is_resume(message: dict[str, Any]) -> bool:
    return message.get("continue") is True and "op" not in message


def release(turn: Any) -> dict[str, Any]:
    """The caller, at a turn point, before it hands the GPU over: free the cached GPU memory."""
    return {"release": True, "turn": turn}


def is_release(message: dict[str, Any]) -> bool:
    return message.get("release") is True and "op" not in message


def error_payload(exc: BaseException) -> dict[str, Any]:
    kind = type(exc).__name__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        kind = f"{module.split('.')[0]}.{kind}" if module.startswith("torch") else kind
    return {
        "type": kind,
        "message": str(exc) or kind,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:],
    }


def is_oom_error(err: dict[str, Any]) -> bool:
    kind = str(err.get("type", ""))
    message = str(err.get("message", "")).lower()
    return kind in OOM_TYPES or kind.endswith("OutOfMemoryError") or "out of memory" in message


def is_sticky_cuda_error(text: str) -> bool:
    low = text.lower()
    return any(m in low for m in STICKY_CUDA_MARKERS)


def is_illegal_access(text: str) -> bool:
    low = text.lower()
    return any(m in low for m in ILLEGAL_ACCESS_MARKERS)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "the Worker stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the Worker died of {name}"
    return f"the Worker exited with status {returncode}"


def classify_death(returncode: int | None, stderr_tail: str, sandboxed: bool = False) -> tuple[str, str]:
    """(verdict, message) for a Worker that died mid-request."""
    low = stderr_tail.lower()
    how = describe_exit(returncode)
    if sandboxed and returncode == -signal.SIGXFSZ:
        return "sandbox_violation", f"the candidate exceeded the file size limit: {how}"
    if is_illegal_access(low):
        return "crashed", f"illegal memory access: {how}"
    if any(m in low for m in OOM_MARKERS):
        return "oom", f"out of memory: {how}"
    if returncode == -signal.SIGKILL:
        # Nobody here sent it: most likely the kernel's OOM killer.
        return "crashed", f"{how} (killed from outside; the system OOM killer is the usual cause)"
    if returncode == -signal.SIGSEGV:
        return "crashed", f"{how} (segmentation fault)"
    if returncode == -signal.SIGABRT:
        return "crashed", f"{how} (abort)"
    return "crashed", how



# -- kept baselines (docs/baselines.md) ---------------------------------------------------------
# Eager and torch.compile times belong to the reference, its inputs, the GPU, torch, the compile
# mode and the timing method, not to a candidate: the caller keeps them in the store and sends
# the ones of a Task's reference in the evaluate options; the Worker, which alone knows the
# input shapes, the GPU's uuid and torch's version, builds the key and uses a match or measures.
BASELINE_PARTS = ("reference", "inputs", "gpu", "torch", "compile_mode", "method")
CACHED_BASELINES = "cached_baselines"        # option: list of baseline records (the store's rows)
REMEASURE_BASELINES = "remeasure_baselines"  # option: measure them again even when one is kept


def baseline_key(parts: dict[str, Any]) -> str:
    """The one key of a baseline measurement: every part of BASELINE_PARTS, none empty."""
    import hashlib

    missing = [p for p in BASELINE_PARTS if not str(parts.get(p) or "")]
    if missing:
        raise ValueError(f"a baseline key needs {', '.join(missing)}")
    text = json.dumps([str(parts[p]) for p in BASELINE_PARTS])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


REFERENCE_ROOTS = ("Model", "get_inputs", "get_init_inputs")


@functools.lru_cache(maxsize=32)
def reference_fingerprint(source: str) -> str:
    """A hash of what the reference's timing depends on: `Model`, `get_inputs`,
    `get_init_inputs` and the module-level statements they use (imports, constants, helpers),
    as syntax, so that comments, formatting and a `ModelNew` (with its CUDA strings and
    load_inline) sharing the file do not change it. Unparsable text: the whole text.
    Kept per text: an evaluation asks for it several times (the kept baselines, the reference's
    torch.compile ahead, the server's profile), and a Search asks for every candidate."""
    import ast
    import hashlib

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return "text:" + hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    kept = _reference_statements(tree)
    body = [ast.dump(tree.body[i], include_attributes=False) for i in sorted(kept)]
    return hashlib.sha256("\n".join(body).encode("utf-8")).hexdigest()[:24]


def reference_only_source(source: str) -> str | None:
    """The reference's own statements (those `reference_fingerprint` hashes), every other
    statement blanked with its lines kept: a file that also holds a `ModelNew` (with its
    load_inline builds) loses it. None for text that does not parse."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    kept = _reference_statements(tree)
    lines = source.splitlines(keepends=True)
    for i, node in enumerate(tree.body):
        if i in kept:
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        for n in range(first - 1, (node.end_lineno or node.lineno)):
            lines[n] = "\n"
    return "".join(lines)


def _reference_statements(tree: Any) -> set[int]:
    """Indexes of the module-level statements the reference needs (see reference_fingerprint)."""
    import ast

    binds: dict[int, set[str]] = {}
    for i, node in enumerate(tree.body):
        binds[i] = _bound_names(node)
    wanted = set(REFERENCE_ROOTS)
    kept: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, node in enumerate(tree.body):
            if i in kept:
                continue
            # Imports and statements that bind no name (torch settings, seeds, `if` blocks) may
            # matter to any of them; a docstring does not.
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if isinstance(node, (ast.Import, ast.ImportFrom)) or (not binds[i] and not docstring) \
                    or binds[i] & wanted:
                kept.add(i)
                wanted |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                changed = True
    return kept


def _bound_names(node: Any) -> set[str]:
    import ast

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets: list[Any] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    names: set[str] = set()
    for t in targets:
        names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names
