"""The tuner: no LLM. Finds tunable integer constants and sweeps them.

CUDA (a .cu, or CUDA text embedded in a Python file): `#define NAME <int>`,
`constexpr int NAME = <int>`, template int parameters with defaults,
`__launch_bounds__(N)`, `#pragma unroll N`, literal block sizes in `<<<grid, 128>>>`
and `dim3 block(16, 16)`. Python: top-level `NAME = <int>` constants, and
`torch.compile` modes on ModelNew (CUDA graphs through "reduce-overhead") on a GPU, and
on the CPU torch.compile's default mode when the start's own torch.compile baseline beat it.
These are labelled candidates: the engine calls them PyTorch rewrites (no custom kernel).
With nothing to vary, the tuner says so at once (`precheck`): such a source needs an LLM.

Each call proposes one-parameter changes of the parent (powers of two around the
current value, within the parameter's limits); with the Search expanding its best
node, that is coordinate descent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernel_lsp.intexpr import eval_int
from kernel_lsp.model import Candidate

from .proposer import Proposal, ProposalRequest


@dataclass(frozen=True)
class Tunable:
    name: str
    kind: str          # define | constexpr | template | launch_bounds | unroll | launch | dim3 | python
    value: int
    start: int         # offset of the number in the source
    end: int
    lo: int = 1
    hi: int = 65536
    multiple: int = 1

    def label(self) -> str:
        return self.name


_THREADY = re.compile(r"THREAD|BLOCK_SIZE|BLOCKSIZE|BLOCK_DIM|TPB|NTHREADS|BLOCK$|^BS$", re.I)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("define", re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+\(?(\d+)\)?[ \t]*(?://.*)?$", re.M)),
    ("constexpr", re.compile(
        r"\b(?:static\s+)?constexpr\s+(?:const\s+)?(?:unsigned\s+|signed\s+)?(?:int|long|size_t|"
        r"unsigned|int32_t|int64_t|uint32_t)\s+([A-Za-z_]\w*)\s*=\s*(\d+)\s*;")),
    ("launch_bounds", re.compile(r"__launch_bounds__\s*\(\s*()(\d+)")),
    ("unroll", re.compile(r"#\s*pragma\s+unroll\s*\(?\s*()(\d+)")),
    ("launch", re.compile(r"<<<\s*[^,<>]+?,\s*()(\d+)\s*(?:,|>>>)")),
]
_TEMPLATE = re.compile(r"template\s*<([^<>]*)>")
_TEMPLATE_PARAM = re.compile(r"\b(?:int|unsigned|size_t|long)\s+([A-Za-z_]\w*)\s*=\s*(\d+)")
_DIM3 = re.compile(r"\bdim3\s+([A-Za-z_]\w*)\s*[({]\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?[)}]")
_PY_CONST = re.compile(r"^([A-Z][A-Z0-9_]*)\s*(?::\s*int\s*)?=\s*(\d+)[ \t]*(?:#.*)?$", re.M)
_COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")


def _limits(name: str, kind: str) -> tuple[int, int, int]:
    thready = _THREADY.search(name) and not re.search(r"PER_THREAD", name, re.I)  # not ITEMS_PER_THREAD
    if kind in ("launch_bounds", "launch") or (kind != "unroll" and thready):
        return 32, 1024, 32
    if kind == "unroll":
        return 1, 32, 1
    return 1, 65536, 1


def find_tunables(source: str, kind: str = "cuda") -> list[Tunable]:
    """Every tunable integer in `source`, in source order (CUDA forms also inside Python strings)."""
    found: dict[int, Tunable] = {}

    def add(name: str, k: str, m: re.Match[str], group: int) -> None:
        value = int(m.group(group))
        lo, hi, mult = _limits(name, k)
        if value <= 0:
            return
        found.setdefault(m.start(group), Tunable(name, k, value, m.start(group), m.end(group), lo, hi, mult))

    for k, pat in _PATTERNS:
        for m in pat.finditer(source):
            name = m.group(1) or {"launch_bounds": "__launch_bounds__", "unroll": "#pragma unroll",
                                  "launch": "launch block size"}[k]
            if k == "unroll":
                name = f"#pragma unroll (line {source.count(chr(10), 0, m.start()) + 1})"
            add(name, k, m, 2)
    for m in _TEMPLATE.finditer(source):
        for p in _TEMPLATE_PARAM.finditer(m.group(1)):
            value = int(p.group(2))
            start = m.start(1) + p.start(2)
            lo, hi, mult = _limits(p.group(1), "template")
            if value > 0:
                found.setdefault(start, Tunable(p.group(1), "template", value, start,
                                                start + len(p.group(2)), lo, hi, mult))
    for m in _DIM3.finditer(source):
        dims = [g for g in (2, 3, 4) if m.group(g) is not None]
        for axis, g in enumerate(dims):
            value = int(m.group(g))
            if value <= 0:
                continue
            # One axis of a block: a power of two up to 1024 (the product is checked later).
            found.setdefault(m.start(g), Tunable(f"{m.group(1)}.{'xyz'[axis]}", "dim3", value,
                                                 m.start(g), m.end(g), 1, 1024, 1))
    if kind == "python":
        for m in _PY_CONST.finditer(source):
            add(m.group(1), "python", m, 2)
    return [found[k] for k in sorted(found)]


def _neighbours(t: Tunable) -> list[int]:
    v = t.value
    out: list[int] = []
    for f in (2, 0.5, 4, 0.25):
        n = int(v * f)
        if f < 1 and v % int(1 / f):
            n = 1 << max(0, (v // int(1 / f)).bit_length() - 1) if v // int(1 / f) else 0
        if n == v or n < t.lo or n > t.hi or n % t.multiple:
            continue
        if n not in out:
            out.append(n)
    return out


_BOUNDS_EXPR = re.compile(r"__launch_bounds__\s*\(\s*([^,()]+(?:\([^()]*\)[^,()]*)*)")
_LAUNCH_EXPR = re.compile(r"<<<\s*[^,<>]+?,\s*([^,<>]+?)\s*(?:,|>>>)")
_DIM3_ANY = re.compile(r"\bdim3\s+([A-Za-z_]\w*)\s*[({]([^(){};]*)[)}]")


def _value(expr: str, names: dict[str, int]) -> int | None:
    """An integer expression of literals and known constants (kernel_lsp.intexpr), or None."""
    return eval_int(expr, names)


def threads_ok(source: str, kind: str = "cuda") -> bool:
    """Every block size we can compute (launch bounds, launch configs, dim3 blocks) is 1..1024."""
    names = {t.name: t.value for t in find_tunables(source, kind) if t.kind in ("define", "constexpr", "python")}
    sizes = [_value(m.group(1), names) for m in _BOUNDS_EXPR.finditer(source)]
    sizes += [_value(m.group(1), names) for m in _LAUNCH_EXPR.finditer(source)]
    for m in _DIM3_ANY.finditer(source):
        if re.search(r"block|thread|tpb", m.group(1), re.I):
            dims = [_value(d, names) for d in m.group(2).split(",")]
            if all(d is not None for d in dims):
                prod = 1
                for d in dims:
                    prod *= d  # type: ignore[operator]
                sizes.append(prod)
    return all(v is None or 0 < v <= 1024 for v in sizes)


def _dim3_product_ok(source: str) -> bool:
    for m in _DIM3.finditer(source):
        if not re.search(r"block|thread|tpb", m.group(1), re.I):
            continue
        prod = 1
        for g in (2, 3, 4):
            if m.group(g) is not None:
                prod *= int(m.group(g))
        if prod > 1024:
            return False
    return True


def variants(source: str, kind: str = "cuda") -> list[tuple[str, str]]:
    """(new source, note) for every one-parameter change of `source`."""
    tunables = find_tunables(source, kind)
    bounds = [t for t in tunables if t.kind == "launch_bounds"]
    out: list[tuple[str, str]] = []
    for t in tunables:
        for n in _neighbours(t):
            if t.kind == "launch_bounds" and n < t.value:
                continue  # a bound below the launch's block size makes the launch fail
            edits = [(t.start, t.end, str(n))]
            # Keep __launch_bounds__ in step with a block size that had the same value.
            if t.kind != "launch_bounds" and t.multiple == 32:
                edits += [(b.start, b.end, str(n)) for b in bounds if b.value == t.value]
            new = source
            for s, e, text in sorted(set(edits), reverse=True):
                new = new[:s] + text + new[e:]
            if (t.kind == "dim3" and not _dim3_product_ok(new)) or not threads_ok(new, kind):
                continue  # a block of more than 1024 threads cannot launch
            out.append((new, f"{t.label()} {t.value} -> {n}"))
    return out


_MODE_NOTES = {"reduce-overhead": " (CUDA graphs)"}


def compile_variants(source: str, modes: tuple[str, ...] = _COMPILE_MODES) -> list[tuple[str, str]]:
    """torch.compile modes on ModelNew; "reduce-overhead" uses CUDA graphs."""
    if not can_compile(source):
        return []
    out = []
    for mode in modes:
        tail = (f"\n\n# kernel-lsp tuner: torch.compile mode={mode!r}\n"
                f"ModelNew.forward = torch.compile(ModelNew.forward, mode={mode!r})\n")
        out.append((source.rstrip("\n") + tail, f"torch.compile(mode={mode!r}){_MODE_NOTES.get(mode, '')}"))
    return out


def can_compile(source: str) -> bool:
    return "ModelNew" in source and "torch.compile" not in source


NEEDS_LLM = ("rewriting it needs an LLM: configure a model endpoint (--model / KERNEL_LSP_MODEL, "
             "and --base-url / OPENAI_BASE_URL for a local server)")


def parent_is_python(request: ProposalRequest) -> bool:
    return request.parent.kind == "python" and can_compile(request.parent.source)


def hand_out(queue: list[Candidate], seen: set[str], count: int) -> list[Proposal]:
    """Up to `count` (at least one) variants from the front of `queue` not handed out before."""
    out: list[Proposal] = []
    while queue and len(out) < max(1, count):
        cand = queue.pop(0)
        if cand.id in seen:
            continue
        seen.add(cand.id)
        out.append(Proposal(candidate=cand, form="tuner"))
    return out


class TunerProposer:
    """Sweeps tunable constants; needs no model and no network."""

    name = "tuner"
    model: str | None = None
    can_repair = False      # the Search does not ask it to fix failing candidates
    uses_profile = False

    def __init__(self, *, torch_compile: bool | None = None) -> None:
        # None: try torch.compile modes only on a GPU device (CPU inductor builds are slow).
        self.torch_compile = torch_compile
        self._seen: set[str] = set()
        self._queues: dict[str, list[Candidate]] = {}

    async def aclose(self) -> None:
        pass

    def _on_gpu(self, device: dict) -> bool:
        dev = str(device.get("name", "") or device.get("type", "")).lower()
        return bool(dev) and "cpu" not in dev

    def _compile_modes(self, request: ProposalRequest) -> tuple[str, ...]:
        if self.torch_compile is not None:
            return _COMPILE_MODES if self.torch_compile else ()
        if self._on_gpu(request.device):
            return _COMPILE_MODES
        # CPU: inductor builds are slow (minutes for a Python loop); offer its default mode only
        # when the start's own torch.compile baseline showed it is faster here.
        start = request.start_evaluation
        if start is not None and start.speedup_compile is not None and start.speedup_compile < 1.0:
            return ("default",)
        return ()

    def _all_for(self, request: ProposalRequest) -> list[Candidate]:
        parent = request.parent
        pairs = variants(parent.source, parent.kind)
        if parent.kind == "python":
            pairs += compile_variants(parent.source, self._compile_modes(request))
        return [Candidate(source=s, kind=parent.kind, origin="tuner", parent=parent.id, note=n)
                for s, n in pairs]

    def precheck(self, start: Candidate, device: dict) -> str | None:
        """Why the tuner cannot do anything for `start`, before any timing; None when it may."""
        if find_tunables(start.source, start.kind):
            return None
        if start.kind == "python" and can_compile(start.source) and self.torch_compile is not False:
            return None  # torch.compile modes (on the CPU only if its baseline wins; see propose)
        return ("the tuner found nothing to vary in this source (no tunable constants such as "
                "`#define BLOCK 256`, launch block sizes or UPPER_CASE integers"
                + (", and torch.compile needs a ModelNew without it" if start.kind == "python" else "")
                + f"); {NEEDS_LLM}")

    async def propose(self, request: ProposalRequest) -> list[Proposal]:
        if request.mode == "repair":
            # A tuner cannot repair code; the Search records the reason.
            return [Proposal.failed("the tuner cannot repair a failing candidate", form="tuner")]
        pid = request.parent.id
        self._seen.add(pid)
        if request.start_evaluation is not None:
            self._seen.add(request.start_evaluation.candidate)  # stepping back to the start is no news
        if pid not in self._queues:
            self._queues[pid] = self._all_for(request)
            if not self._queues[pid] and request.start_evaluation is not None \
                    and pid == request.start_evaluation.candidate:
                why = ("torch.compile was not faster than the start on this CPU"
                       if parent_is_python(request) else "no tunable constants")
                return [Proposal.failed(f"the tuner has nothing to try for this source ({why}); {NEEDS_LLM}",
                                        fatal=True, form="tuner")]
        return hand_out(self._queues[pid], self._seen, request.count)

    def exhausted(self, parent: Candidate) -> bool:
        """True once every variant of `parent` has been handed out."""
        q = self._queues.get(parent.id)
        return q is not None and not any(c.id not in self._seen for c in q)
