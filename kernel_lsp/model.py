"""The shared records: Task, Candidate, Evaluation and the rest.

Standard library only: the Worker (engine), the agent, the store, the CLI and the
server all exchange these, and the Worker runs where no LSP package is installed.
Every record turns into plain JSON with ``to_dict`` and back with ``from_dict``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "information", "hint"]

# One short word for what an Evaluation found (`kernel-lsp bench --json` "verdict").
VERDICTS = (
    "correct",           # matches the reference on every input set
    "mismatch",          # values differ beyond tolerance
    "unwritten_output",  # poisoned (NaN) output elements survived the run
    "mutated_input",     # the candidate changed its inputs
    "stale_result",      # results reused across calls / input sets
    "bad_output",        # wrong type, shape, dtype, device, strides, or a tensor subclass
    "nan",               # NaN/Inf where the reference has none
    "timeout",           # ran past its deadline; the Worker was restarted
    "crashed",           # the Worker died (segfault, illegal memory access, abort)
    "oom",               # out of memory
    "compile_error",     # the candidate did not build
    "error",             # it raised, or the harness could not run it
    "not_run",           # nothing could run (no GPU for a CUDA task, execution off)
    "sandbox_violation",  # the sandbox stopped it (process or file size limit, network, a write)
)


# Evaluation flags that keep a candidate from counting (the cheats of docs/cheats.md); the engine
# adds "not_counted" beside any of them, and the guard refuses both. "torch_fallback" is not
# one: a correct, faster PyTorch rewrite is a real result for the user, labelled
# PYTORCH_REWRITE (Evaluation.custom_kernel False) and never counted as a kernel speedup;
# KERNELS_ONLY_FLAGS is the strict rule (`kernels_only`) for people who score custom kernels.
DISQUALIFYING_FLAGS = frozenset({
    "timer_patch", "tampering", "side_stream", "thread_started", "result_cache",
    "result_cache_suspected", "precision_lowering", "cuda_graph", "beyond_roofline",
})
# Correct, but not as the Task asks (docs/correctness.md): `less_accurate` (beyond the accuracy
# budget, within KernelBench's 1e-2: counted only with the accept_less_accurate setting) and
# `eval_only` (right in eval mode, wrong in training mode; a Task that declares MODE = "eval"
# is only verified in eval mode). Both keep a candidate from counting, as the cheats do.
ACCURACY_FLAGS = frozenset({"less_accurate", "eval_only"})
DISQUALIFYING_FLAGS = DISQUALIFYING_FLAGS | ACCURACY_FLAGS
KERNELS_ONLY_FLAGS = DISQUALIFYING_FLAGS | {"torch_fallback"}


def disqualified_by(flags: "list[str] | set[str] | tuple[str, ...]", accept_less_accurate: bool = False,
                    bad: frozenset[str] | None = None) -> list[str]:
    """The flags among `flags` that keep a candidate from counting; `accept_less_accurate` (the
    setting) counts a `less_accurate` one, and then its own "not_counted" does not hold it back."""
    bad = DISQUALIFYING_FLAGS if bad is None else bad
    found = set(flags) & bad
    if accept_less_accurate:
        found.discard("less_accurate")
        if not (found - {"not_counted"}) & DISQUALIFYING_FLAGS:
            found.discard("not_counted")
    return sorted(found)

# The two kinds of result (Evaluation.label) and the spread above which a timing is a warning.
CUSTOM_KERNEL = "custom kernel"
PYTORCH_REWRITE = "PyTorch rewrite (no custom kernel)"
NOISY_SPREAD_PCT = 10.0


class _Record:
    """to_dict/from_dict for nested dataclasses (lists of records included)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value = data[f.name]
            kind = _NESTED.get((cls.__name__, f.name))
            if kind is not None and value is not None:
                if isinstance(value, list):
                    value = [kind.from_dict(v) for v in value]
                else:
                    value = kind.from_dict(value)
            kwargs[f.name] = value
        return cls(**kwargs)


@dataclass(frozen=True)
class Span(_Record):
    """A range in a document: 0-based lines, 0-based columns in code points, end exclusive."""

    start_line: int
    start_col: int
    end_line: int
    end_col: int

    def contains(self, line: int, col: int) -> bool:
        after_start = (line, col) >= (self.start_line, self.start_col)
        before_end = (line, col) <= (self.end_line, self.end_col)
        return after_start and before_end


@dataclass
class Diagnostic(_Record):
    """A compiler (or checker) message placed in the user's document."""

    span: Span
    severity: Severity
    message: str
    source: str = "nvcc"
    code: str | None = None
    path: str | None = None  # the document it belongs to; None for the file compiled


@dataclass
class ResourceUsage(_Record):
    """What ptxas reported for one kernel, plus the theoretical occupancy it implies."""

    kernel: str                 # name as written in the source (demangled, no parameters)
    mangled: str
    arch: str                   # e.g. "sm_90"
    registers: int = 0
    shared_bytes: int = 0       # static shared memory per block
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    constant_bytes: int = 0
    threads_per_block: int | None = None   # from __launch_bounds__ or the launch site, if known
    occupancy: float | None = None         # 0..1, theoretical, for threads_per_block
    occupancy_limiter: str | None = None   # "registers" | "shared memory" | "blocks" | "threads"


@dataclass
class CompileResult(_Record):
    ok: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    resources: list[ResourceUsage] = field(default_factory=list)
    log: str = ""
    seconds: float = 0.0
    cached: bool = False
    command: list[str] = field(default_factory=list)
    fast_path: bool = False     # a load_inline extension built by the split fast path
    fallback_reason: str = ""   # why an extension took the full build instead ("" when it did not)
    steps: dict[str, float] = field(default_factory=dict)  # the fast build's seconds: device, host, link, load


class TargetKind(str, enum.Enum):
    CUDA_KERNEL = "cuda_kernel"          # a __global__ function
    HOST_EXPORT = "host_export"          # a host function exported to Python
    TASK_MODEL = "model"                 # KernelBench `Model`
    CANDIDATE_MODEL = "model_new"        # KernelBench `ModelNew`
    NN_MODULE = "nn_module"              # any other nn.Module
    TRITON_KERNEL = "triton_kernel"      # @triton.jit
    EMBEDDED_CUDA = "embedded_cuda"      # CUDA/C++ text in a Python string for load_inline/load


@dataclass
class Target(_Record):
    """Something that can be measured or optimized, with its place in a document."""

    name: str
    kind: TargetKind
    path: str
    span: Span                  # the whole definition
    name_span: Span             # the identifier
    detail: str = ""            # a one-line signature for symbols and hovers
    data: dict[str, Any] = field(default_factory=dict)  # kind-specific facts (params, launch bounds...)


@dataclass
class Task(_Record):
    """A Target plus its harness (the KernelBench contract: see docs/architecture.md)."""

    name: str
    reference_path: str          # the .py with Model, get_inputs, get_init_inputs
    reference_source: str        # its text (an unsaved editor buffer is fine)
    cuda_path: str | None = None     # a .cu task: the kernel file the harness stands beside
    entry: str | None = None         # the exported function that stands for Model.forward
    atol: float | None = None        # None: the dtype's default
    rtol: float | None = None
    mode: str | None = None          # "eval": an inference Task (MODE = "eval"), training mode not verified


@dataclass
class Candidate(_Record):
    """One source text proposed for a Task."""

    source: str
    kind: Literal["python", "cuda"]  # a file defining ModelNew, or a .cu standing for Model.forward
    origin: str = "user"             # user | llm | tuner | repair
    parent: str | None = None        # id of the Candidate it was made from
    note: str = ""                   # what the Proposer says it changed

    @property
    def id(self) -> str:
        return source_hash(self.source, self.kind)


@dataclass
class Timing(_Record):
    """A timed call: median and spread over `runs` separate calls, in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    spread_pct: float    # interquartile range over median, in percent
    runs: int


@dataclass
class Evaluation(_Record):
    """What running a Candidate gave."""

    task: str
    candidate: str                       # Candidate.id
    verdict: str = "not_run"             # one of VERDICTS
    correct: bool | None = None          # None when it could not run
    message: str = ""                    # one human sentence
    flags: list[str] = field(default_factory=list)   # torch_fallback, beyond_roofline, ...
    evidence: dict[str, Any] | None = None           # output, input_set, max_abs_err, max_rel_err, where
    compile: CompileResult | None = None
    time: Timing | None = None           # the candidate
    eager: Timing | None = None          # PyTorch eager reference
    compiled: Timing | None = None       # torch.compile of the reference
    profile: dict[str, Any] | None = None
    device: dict[str, Any] | None = None  # name, sm_count, capability, clocks, memory bandwidth
    versions: dict[str, str] = field(default_factory=dict)
    wall_seconds: float = 0.0
    sandboxed: bool = False              # whether its Worker ran in the sandbox (engine/caller/sandbox.py)
    # True: the speed comes from the candidate's own kernel; False: a PyTorch rewrite (no custom
    # kernel, or PyTorch ops doing the reference's work beside one); None: not known (not run).
    custom_kernel: bool | None = None
    # Other processes used the GPU while this was timed: {"processes": [{pid, name, memory_mib}],
    # "count", "source": "nvml" | "nvidia-smi", "spread_pct"}; None when alone or not a GPU.
    shared_gpu: dict[str, Any] | None = None
    # How close to the float64 oracle (docs/correctness.md): "rule" (oracle | task_tolerance |
    # fixed_tolerance), "rule_text", the worst output's "ratio" (its error over the reference's
    # own), "cand_err", "ref_err", "budget", "outcome", every output's worst "outputs", the
    # "modes" verified and the "oracle"'s cost; None when nothing was verified.
    accuracy: dict[str, Any] | None = None

    @property
    def label(self) -> str | None:
        """CUSTOM_KERNEL or PYTORCH_REWRITE; None when unknown."""
        if self.custom_kernel is None:
            return None
        return CUSTOM_KERNEL if self.custom_kernel else PYTORCH_REWRITE

    @property
    def noisy(self) -> bool:
        """The candidate's timing spread is above NOISY_SPREAD_PCT: a warning, not a fact."""
        return self.time is not None and self.time.spread_pct > NOISY_SPREAD_PCT

    @property
    def compile_faster(self) -> bool | None:
        """torch.compile of the reference beats this candidate (None: not both timed)."""
        s = self.speedup_compile
        return None if s is None else s < 1.0
    executor: str = "local"              # where it ran: "local" (a subprocess here) or "ray"
    node: str | None = None              # the Ray node (address and id) it ran on; None locally
    # How eager and torch.compile were had: {"cached": True} kept from an earlier measurement
    # (with its "measured_at", epoch seconds), or measured now ("interleaved" with the candidate,
    # "keep": whether the caller should keep them); "key"/"parts" say what they hold for
    # (docs/baselines.md). None when no baselines were asked for.
    baselines: dict[str, Any] | None = None
    # True on a partial Evaluation (protocol.partial): the verdict and the candidate and eager
    # timings are final-method numbers, torch.compile's baseline is still compiling; the
    # complete Evaluation follows and replaces it. Never True on a stored Evaluation.
    compiled_pending: bool = False

    @property
    def speedup_eager(self) -> float | None:
        return _ratio(self.eager, self.time)

    @property
    def speedup_compile(self) -> float | None:
        return _ratio(self.compiled, self.time)

    def summary(self) -> dict[str, Any]:
        """The `kernel-lsp bench --json` object for one Target."""
        return {
            "target": self.task,
            "candidate": self.candidate,
            "correct": self.correct,
            "verdict": self.verdict,
            "message": self.message,
            "flags": list(self.flags),
            "evidence": self.evidence,
            "time_ms": self.time.median_ms if self.time else None,
            "eager_ms": self.eager.median_ms if self.eager else None,
            "compile_ms": self.compiled.median_ms if self.compiled else None,
            "speedup_eager": self.speedup_eager,
            "speedup_compile": self.speedup_compile,
            "spread_pct": self.time.spread_pct if self.time else None,
            "device": self.device,
            "sandboxed": self.sandboxed,
            "custom_kernel": self.custom_kernel,
            "label": self.label,
            "noisy": self.noisy,
            "compile_faster": self.compile_faster,
            "shared_gpu": self.shared_gpu,
            "accuracy": self.accuracy,
            "executor": self.executor,
            "node": self.node,
            "eager_spread_pct": self.eager.spread_pct if self.eager else None,
            "compile_spread_pct": self.compiled.spread_pct if self.compiled else None,
            "baselines_cached": (bool(self.baselines.get("cached")) if self.baselines else None),
            "baselines_measured_at": (self.baselines.get("measured_at") if self.baselines else None),
        }


def _ratio(base: Timing | None, new: Timing | None) -> float | None:
    if base is None or new is None or new.median_ms <= 0:
        return None
    return base.median_ms / new.median_ms


def source_hash(text: str, *salt: str) -> str:
    """Content hash used for Candidates, build caches and compile caches."""
    h = hashlib.sha256()
    for part in (*salt, text):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]


_NESTED: dict[tuple[str, str], type[_Record]] = {
    ("Diagnostic", "span"): Span,
    ("CompileResult", "diagnostics"): Diagnostic,
    ("CompileResult", "resources"): ResourceUsage,
    ("Target", "span"): Span,
    ("Target", "name_span"): Span,
    ("Evaluation", "compile"): CompileResult,
    ("Evaluation", "time"): Timing,
    ("Evaluation", "eager"): Timing,
    ("Evaluation", "compiled"): Timing,
}
