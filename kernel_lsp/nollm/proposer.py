"""The no-LLM Proposer for module Targets (the tuner's family).

Round 1, from the start (the reference as ModelNew, i.e. eager): the Worker records what
torch.compile writes for the module (default, max-autotune, and the default with one of Inductor's
heuristic choices made the other way: inductor_code.VARIANTS), and each recording that converts
becomes a standalone ModelNew file (writer.py): candidate 1 is the default one; the others (each
variant's, then max-autotune's GEMM/convolution and launch choices) are candidates beside it where
their code differs. Later rounds, from a generated file: eager's ops in place of a kernel
(eager_ops.py), the forward in one CUDA graph (graphs.py, flagged so never kept), and every
one-parameter change of one kernel's launch configuration (sweep.py). Each is a Candidate, verified, timed and guarded like any other; the start, eager,
stays the floor (the guard keeps only what beats it), so the result is never slower than eager.

`custom_kernel` comes from the engine's own static checks: Triton kernels count; a file whose
forward also calls torch.mm/convolution is labelled as such by the engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kernel_lsp.model import Candidate

from kernel_lsp.agent.proposer import Proposal, ProposalRequest
from kernel_lsp.agent.tuner import hand_out
from kernel_lsp.engine.worker.inductor_code import MODES, SEARCH_MODES, VARIANTS

from . import eager_ops, graphs, sweep
from .writer import Generated, NotConvertible, describe, write_model_new

MODE_LABELS = {"default": "default", "max-autotune-no-cudagraphs": "max-autotune",
               **{mode: v.label for mode, v in VARIANTS.items()}}
NO_GPU = ("writing this module's kernels needs a CUDA GPU: torch.compile writes its Triton kernels for "
          "the GPU it runs on, and none is visible here")


def is_module_start(start: Candidate) -> bool:
    """A Python Task with no kernel of its own: the reference as ModelNew, or a ModelNew that
    only calls PyTorch."""
    from kernel_lsp.engine.worker.judge.static_checks import has_kernel

    return start.kind == "python" and not has_kernel(start.source)


def label(gen: Generated, mode: str, tuned: int = 0, source: str | None = None) -> str:
    """What a file is: "Triton kernels generated from torch.compile (default), tuned: 2 launch changes,
    1 eager op kept, one CUDA graph: 4 Triton kernels, 1 torch library call (torch.mm)". The kernel
    count is what the file launches itself (eager ops kept are PyTorch's)."""
    text = f"Triton kernels generated from torch.compile ({MODE_LABELS.get(mode, mode)})"
    text += f", tuned: {tuned} launch change{'s' if tuned != 1 else ''}" if tuned else ""
    kept = eager_ops.kept_count(source) if source else 0
    if kept:
        text += f", {kept} eager op{'s' if kept != 1 else ''} kept"
    if source and graphs.is_graphed(source):
        text += ", one CUDA graph (inputs copied in, outputs copied out)"
    return f"{text}: {describe(gen, kept)}"


async def generate(engine: Any, reference_source: str, modes: tuple[str, ...] | None = None,
                   timeout: float = 600.0) -> tuple[dict[str, Generated], dict[str, str]]:
    """({mode: Generated}, {mode: why not}) for a reference, through the engine's Worker.
    A machine that cannot record at all gives {"*": why}."""
    params: dict[str, Any] = {"reference_source": reference_source, "modes": list(modes or MODES)}
    if set(params["modes"]) & set(VARIANTS):  # they start only within the first half of the time
        params["variants_within_s"] = timeout / 2
    try:
        rec = await engine.request("inductor_code", params, timeout=timeout, warm=True)
    except Exception as exc:  # noqa: BLE001 - a dead or timed-out Worker is one sentence (a cancel is not an Exception)
        return {}, {"*": f"recording torch.compile's code failed: {exc}"}
    if not isinstance(rec, dict) or rec.get("why"):
        return {}, {"*": str((rec or {}).get("why") or "the Worker gave no recording")}
    # Parsing Inductor's modules takes tens of milliseconds per mode (more for a whole model): off the
    # caller's event loop (the server's, for the code action and an optimize).
    return await asyncio.to_thread(convert_recording, reference_source, rec)


def convert_recording(reference_source: str, rec: dict[str, Any]) -> tuple[dict[str, Generated], dict[str, str]]:
    out: dict[str, Generated] = {}
    why: dict[str, str] = {}
    for mode, row in (rec.get("modes") or {}).items():
        if row.get("skipped"):
            why[mode] = str(row["skipped"])
            continue
        if row.get("same_as"):
            why[mode] = f"the same code as torch.compile's {MODE_LABELS.get(row['same_as'], row['same_as'])}"
            continue
        if row.get("error"):
            why[mode] = str(row["error"])
            continue
        try:
            out[mode] = write_model_new(reference_source, row.get("codes") or [], row.get("args"),
                                        row.get("configs"), mode=MODE_LABELS.get(mode, mode),
                                        torch_version=str(rec.get("torch") or ""))
        except NotConvertible as exc:
            why[mode] = str(exc)
    return out, why


class InductorProposer:
    """Generated Triton kernels, then their launch configurations swept. No model, no network."""

    name = "tuner"
    model: str | None = None
    can_repair = False
    uses_profile = False

    def __init__(self, engine: Any = None, *, timeout: float = 600.0, cuda_graphs: bool = True,
                 modes: tuple[str, ...] | None = None) -> None:
        self.engine = engine          # set by the caller once its Engine is open
        self.timeout = timeout
        self.modes = tuple(modes or SEARCH_MODES)  # what the Worker records (each a first-round file)
        self.cuda_graphs = cuda_graphs  # offer the CUDA-graph variant (the engine flags it `cuda_graph`)
        self._graph_offered = False
        self.generated: dict[str, Generated] = {}
        self.why: dict[str, str] = {}
        self._labels: dict[str, str] = {}      # candidate id -> label
        self._tuned: dict[str, int] = {}       # candidate id -> launch changes from its generated file
        self._modes: dict[str, str] = {}       # candidate id -> the mode its file came from
        self._queues: dict[str, list[Candidate]] = {}
        self._seen: set[str] = set()

    async def aclose(self) -> None:
        pass

    def precheck(self, start: Candidate, device: dict) -> str | None:
        if device.get("cuda") is False:
            return NO_GPU
        if not is_module_start(start):
            return "the no-LLM writer starts from a module without kernels of its own"
        return None

    def label_for(self, candidate_id: str) -> str | None:
        return self._labels.get(candidate_id)

    async def _first(self, request: ProposalRequest) -> list[Proposal]:
        if self.engine is None:
            return [Proposal.failed("the no-LLM proposer has no engine to record torch.compile's code with",
                                    fatal=True, form="tuner")]
        self.generated, self.why = await generate(self.engine, request.task.reference_source,
                                                  modes=self.modes, timeout=self.timeout)
        if not self.generated:
            reasons = "; ".join(f"{MODE_LABELS.get(m, m) if m != '*' else 'here'}: {w}" for m, w in self.why.items())
            return [Proposal.failed(f"no standalone file could be written from torch.compile's code ({reasons})",
                                    fatal=True, form="tuner")]
        out: list[Candidate] = []
        sources: dict[str, str] = {}
        for mode, gen in self.generated.items():
            # The same kernels from two recordings differ only in the header naming the mode.
            body = gen.source.split('"""', 2)[-1]
            if body in sources:
                self.why[mode] = f"the same file as torch.compile's {MODE_LABELS.get(sources[body], sources[body])}"
                continue
            sources[body] = mode
            lab = label(gen, mode)
            cand = Candidate(source=gen.source, kind="python", origin="tuner", parent=request.parent.id, note=lab)
            self._labels[cand.id], self._tuned[cand.id], self._modes[cand.id] = lab, 0, mode
            out.append(cand)
        return [Proposal(candidate=c, form="tuner") for c in out]

    def _sweep(self, parent: Candidate) -> list[Candidate]:
        """From a generated file: eager's ops in place of each kernel that has them, the whole forward
        in one CUDA graph, then every one-parameter launch change (few structural variants first,
        so a small budget still sees them)."""
        base_tuned = self._tuned.get(parent.id, 0)
        mode = self._modes.get(parent.id, "default")
        gen = self.generated.get(mode)
        steps: list[tuple[str, str, int]] = []
        for op in (gen.eager.values() if gen is not None else []):
            source = eager_ops.apply(parent.source, op)
            if source is not None:
                steps.append((source, f"{op.kernel} left to eager ({', '.join(op.ops)})", 0))
        if self.cuda_graphs and not self._graph_offered:  # once per Search: the flag keeps it from counting
            source = graphs.graphed(parent.source)
            if source is not None:
                self._graph_offered = True
                steps.append((source, "the whole forward replayed from one CUDA graph", 0))
        steps += [(source, note, 1) for source, note in sweep.variants(parent.source)]
        out = []
        for source, note, tuned in steps:
            cand = Candidate(source=source, kind="python", origin="tuner", parent=parent.id, note=note)
            self._tuned[cand.id] = base_tuned + tuned
            self._modes[cand.id] = mode
            if gen is not None:
                self._labels[cand.id] = label(gen, mode, base_tuned + tuned, source)
            out.append(cand)
        return out

    async def propose(self, request: ProposalRequest) -> list[Proposal]:
        if request.mode == "repair":
            return [Proposal.failed("the no-LLM proposer cannot repair a failing candidate", form="tuner")]
        pid = request.parent.id
        self._seen.add(pid)
        if pid not in self._queues:
            if pid not in self._tuned:  # the start (or any file not generated here)
                self._queues[pid] = []
                if not self.generated and not self.why:
                    return await self._first(request)
                return []
            self._queues[pid] = self._sweep(request.parent)
        return hand_out(self._queues[pid], self._seen, request.count)


def for_start(proposer: Any, start: Candidate) -> Any:
    """The tuner on a module Target (no kernel of its own, and no constants of its own beside the
    reference's, which are the Task's shapes) becomes the no-LLM writer; any other stays."""
    from kernel_lsp.agent.tuner import TunerProposer, find_tunables
    from kernel_lsp.engine.protocol import reference_only_source

    if not isinstance(proposer, TunerProposer) or not is_module_start(start):
        return proposer
    # A ModelNew of the user's with its own constants (CHUNK = 4) keeps the constant tuner.
    reference = reference_only_source(start.source) or ""
    own = {t.name for t in find_tunables(start.source, "python")} - {t.name for t in find_tunables(reference, "python")}
    return proposer if own else InductorProposer()
