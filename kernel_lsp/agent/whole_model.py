"""Optimize a whole model: profile it, a Task per hot op, a Search per Task, the winners
put back behind guards, the result verified end to end (caller side, no torch).

    result = await optimize_model("model.py", engine, store, make_proposer, WholeModelOptions())
    result.to_dict()   # the `kernel-lsp optimize --whole-model --json` document

Steps:
1. the Worker's ``extract`` op (engine/worker/extract.py) runs ``Model.forward`` on its real
   inputs, profiles it and captures each submodule's call and constructor arguments;
2. `select_ops` (agent/op_tasks.py): from the top, a submodule above ``min_share`` of the time is an op when it
   is a leaf or spends ``min_share`` (and a third of its time) in its own code; otherwise its
   children are looked at;
3. `op_task_source`: each op becomes a KernelBench Task in ``.kernel-lsp/ops/<model>_<op>.py``
   (the user sees, benches and optimizes it like any Task);
4. `split_budget`: the proposals are split by share (at least one each); each Search stops
   early on its patience; Searches run one Engine at a time each (several Engines: several
   GPUs, concurrently);
5. each improved op's winner is kept as ``<model>_<op>_new.py`` beside its Task and
   integrated (agent/integrate.py); the integrated model is a Candidate of the model's own
   Task, so ``Engine.evaluate`` verifies it on fresh inputs and times it against eager and
   torch.compile; while it is wrong or not faster, the replacement with the smallest
   speedup is dropped and it is evaluated again.

`optimize_op(path, op_name, ...)` does steps 1-5 for one op (the editor's hot-op action);
`ops_at(text, line)` (agent/op_lines.py) names the ops a line of the model file stands for.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kernel_lsp.model import CUSTOM_KERNEL, DISQUALIFYING_FLAGS, PYTORCH_REWRITE, Candidate, Evaluation, Task

from .budget import Budget
from .integrate import Replacement, guard_rule, integrated_source
from .op_lines import ops_at
from .op_tasks import (forward_us, not_extractable, op_file_stem, op_task_source, select_ops, split_budget,
                       unattributed_share)

__all__ = ["OpResult", "WholeModelError", "WholeModelOptions", "WholeModelResult", "holds", "holds_label",
           "optimize_model",
           "optimize_op", "ops_at", "select_ops", "split_budget", "write_integrated"]
from .search import Search, SearchOptions, SearchResult

OPS_DIR = os.path.join(".kernel-lsp", "ops")
PROPOSER_NAME = "whole-model"  # the store's `proposer` of a whole-model run's record
# End to end, the integrated model runs the model's own ops around the kernels: reusing
# them is the point, not a fallback. Every other cheat flag still disqualifies.
END_TO_END_BAD_FLAGS = (DISQUALIFYING_FLAGS - {"torch_fallback"})

Progress = Callable[[str], Any]


# torch.nn modules that are one cuBLAS/cuDNN call: the library is near the hardware's peak,
# so a Search's budget is better spent elsewhere unless the user asks (library_ops).
LIBRARY_BOUND = frozenset({"Linear", "Bilinear", "LazyLinear", "Conv1d", "Conv2d", "Conv3d",
                           "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"})


def library_bound(op: "OpResult") -> bool:
    """A torch.nn GEMM or convolution module: one cuBLAS/cuDNN call (LIBRARY_BOUND)."""
    return op.cls in LIBRARY_BOUND and (op.record.get("class") or {}).get("where") == "torch.nn"


class WholeModelError(Exception):
    """The model could not be profiled (not a Task, no GPU for its inputs, it raised)."""


@dataclass
class WholeModelOptions:
    min_share: float = 0.05              # ops below this share of forward are left alone
    budget: int = 24                     # proposals over all ops, split by share; what an op's
                                         # Search leaves unused goes to the ops after it
    patience: int = 2                    # rounds without a new best before an op's Search stops
    min_proposals: int = 1               # each op's Search gets at least this many
    search: SearchOptions | None = None  # template for each op's Search (budget replaced)
    extract_options: dict[str, Any] = field(default_factory=dict)
    end_to_end_options: dict[str, Any] | None = None  # engine options of the end-to-end evaluations
    eval_timeout: float | None = None
    extract_timeout: float = 600.0
    ops: list[str] | None = None         # only these ops (optimize_op); None: every hot op
    library_ops: bool = False            # also search ops that are one cuBLAS/cuDNN call (a GEMM, a
                                         # convolution): skipped by default, the library is near peak


@dataclass
class OpResult:
    name: str
    cls: str
    share: float
    calls: int
    shapes: list[list[int]]
    task: str | None = None              # the extracted Task's path
    reason: str = ""                     # why it was not extracted / not kept
    budget: int = 0
    search: SearchResult | None = None
    kernel: str | None = None            # the winner's file
    kept: bool = False                   # in the integrated model
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        s = self.search
        return s.speedup if s is not None and s.improved else None

    @property
    def speedup_compile(self) -> float | None:
        s = self.search
        if s is None or not s.improved or s.best_evaluation is None or s.best_evaluation.time is None:
            return None
        if s.speedup_compile is not None:  # the Search's own: vs the baseline timed with the start
            return s.speedup_compile
        start = s.start_evaluation  # the start's confirmation re-run times no baselines
        if start is None or start.compiled is None:
            return None
        return start.compiled.median_ms / s.best_evaluation.time.median_ms

    @property
    def spread_pct(self) -> float | None:
        """The larger timing spread of the winner and the op as extracted (the speedup's noise)."""
        s = self.search
        if s is None or not s.improved:
            return None
        spreads = [e.time.spread_pct for e in (s.best_evaluation, s.start_evaluation) if e is not None and e.time]
        return max(spreads) if spreads else None

    @property
    def custom_kernel(self) -> bool | None:
        s = self.search
        if s is None or not s.improved or s.best is None:
            return None
        labelled = getattr(s, "custom_kernel", None)  # the Search's own label, where it gives one
        if isinstance(labelled, bool):
            return labelled
        flags = set(s.best_evaluation.flags if s.best_evaluation else [])
        builds = any(m in s.best.source for m in ("load_inline", "cpp_extension", "triton.jit", "ctypes.CDLL"))
        return builds and "torch_fallback" not in flags

    @property
    def label(self) -> str:
        ck = self.custom_kernel
        return "" if ck is None else "custom kernel" if ck else "PyTorch rewrite"

    def to_dict(self) -> dict[str, Any]:
        s = self.search
        return {"name": self.name, "class": self.cls, "share": round(self.share, 4), "calls": self.calls,
                "task": self.task, "shapes": self.shapes, "budget": self.budget,
                "speedup": self.speedup, "speedup_compile": self.speedup_compile, "spread_pct": self.spread_pct,
                "custom_kernel": self.custom_kernel, "label": self.label,
                "search": s.search_id if s else None, "improved": bool(s and s.improved),
                "kernel": self.kernel, "kept": self.kept, "reason": self.reason or (s.reason if s else "")}


@dataclass
class WholeModelResult:
    model: str
    task: Task
    ops: list[OpResult]
    extraction: dict[str, Any]
    end_to_end: dict[str, Any] | None = None
    integrated: str | None = None        # the integrated source, relative to the model's folder
    replacements: list[Replacement] = field(default_factory=list)
    written: str | None = None
    reason: str = ""
    record: int | None = None            # the store's record of this run (a search id)
    evaluation: Evaluation | None = None

    @property
    def improved(self) -> bool:
        e = self.end_to_end or {}
        return bool(self.replacements) and bool(e.get("correct")) and bool(e.get("faster"))

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.extraction.get("device_name"),
                "time": self.extraction.get("time"), "total_ms": (self.extraction.get("total_us") or 0) / 1e3,
                "unattributed_share": unattributed_share(self.extraction),
                "ops": [o.to_dict() for o in sorted(self.ops, key=lambda o: -o.share)],
                "end_to_end": self.end_to_end, "written": self.written, "reason": self.reason,
                "record": self.record}


def _reference_as_start(task: Task) -> Candidate:
    return Candidate(source=task.reference_source.rstrip("\n") + "\n\n\nclass ModelNew(Model):\n    pass\n",
                     kind="python", origin="user", note="the op as extracted")


async def _report(progress: Progress | None, message: str) -> None:
    if progress is None:
        return
    out = progress(message)
    if asyncio.iscoroutine(out):
        await out


# -- the run ------------------------------------------------------------------------------------

async def extract_model(engine: Any, task: Task, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The Worker's extraction of a model Task; WholeModelError with one line on failure."""
    from kernel_lsp.engine.caller.client import EngineTimeout, WorkerDied, WorkerRaised
    from kernel_lsp.engine.caller.gpu_lock import GPUBusy

    try:
        return await engine.request("extract", {"task": task.to_dict(), "options": options},
                                    timeout=timeout, warm=True)
    except WorkerRaised as exc:
        raise WholeModelError(f"profiling the model failed: {exc.error.get('type')}: "
                              f"{exc.error.get('message')}") from None
    except (WorkerDied, EngineTimeout, GPUBusy) as exc:
        raise WholeModelError(f"profiling the model failed: {exc}") from None


def write_op_tasks(model_path: str, root: str, extraction: dict[str, Any], selected: list[dict[str, Any]],
                   task: Task) -> list[OpResult]:
    ops_dir = os.path.join(root, OPS_DIR)
    out: list[OpResult] = []
    for op in selected:
        shapes = [s["shape"] for s in (op.get("call") or {}).get("args", []) if s["kind"] == "tensor"]
        res = OpResult(name=op["name"], cls=op["class"]["name"], share=op["share"], calls=op["calls"],
                       shapes=shapes, record=op)
        why = not_extractable(op)
        if why:
            res.reason = f"not extracted: {why}"
        else:
            os.makedirs(ops_dir, exist_ok=True)
            path = os.path.join(ops_dir, op_file_stem(model_path, op["name"]) + ".py")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(op_task_source(op, model_path, path, extraction, task.atol, task.rtol))
            res.task = path
        out.append(res)
    return out


async def _run_searches(ops: list[OpResult], engines: list[Any], store: Any,
                        make_proposer: Callable[[OpResult], Any], opts: WholeModelOptions,
                        progress: Progress | None) -> None:
    from kernel_lsp.engine import find_task

    queue: asyncio.Queue[OpResult] = asyncio.Queue()
    for op in ops:
        queue.put_nowait(op)
    spare = [0]   # proposals handed back by finished Searches (patience stopped them early)

    async def worker(engine: Any) -> None:
        while not queue.empty():
            op = queue.get_nowait()
            assert op.task is not None
            op_task, _ = find_task(op.task)
            template = opts.search or SearchOptions()
            # Its share plus what the Searches before it did not use (op.budget stays its share).
            granted, spare[0] = op.budget + spare[0], 0
            budget = Budget(proposals=granted, patience=opts.patience)
            so = SearchOptions(**{**template.__dict__, "budget": budget})
            if opts.eval_timeout is not None:
                so.eval_timeout = opts.eval_timeout
            start = _reference_as_start(op_task)
            proposer = _for_op(make_proposer(op), start, engine)
            await _report(progress, f"{op.name}: searching ({granted} proposal{'s' * (granted != 1)}"
                                    + (f", {granted - op.budget} handed on by earlier ops" if granted > op.budget else "")
                                    + ", "
                                    f"{100 * op.share:.1f}% of forward)")
            try:
                op.search = await Search(engine, store, op_task, start, proposer, so).run()
                spare[0] += max(0, granted - budget.used_proposals)  # handed on to the next op
            finally:
                close = getattr(proposer, "aclose", None)
                if close is not None:
                    await close()
            s = op.search
            await _report(progress, f"{op.name}: " + (f"{s.speedup:.2f}x ({op.label})" if s.improved and s.speedup
                                                      else s.reason))

    await asyncio.gather(*(worker(e) for e in engines))


def _speedup_vs(base: Any, new: Any) -> float | None:
    if base is None or new is None or new.median_ms <= 0:
        return None
    return base.median_ms / new.median_ms


def holds(kept: list[OpResult]) -> dict[str, list[str]]:
    """What the integrated model holds: the ops replaced by custom kernels and by PyTorch rewrites."""
    return {"custom_kernel": [o.name for o in kept if o.custom_kernel is True],
            "pytorch_rewrite": [o.name for o in kept if o.custom_kernel is False]}


def holds_label(held: dict[str, list[str]]) -> str:
    """'custom kernel for mlp.act; PyTorch rewrite for attn': each replaced op with its own label."""
    parts = []
    for key, word in (("custom_kernel", CUSTOM_KERNEL), ("pytorch_rewrite", "PyTorch rewrite")):
        names = held.get(key) or []
        if names:
            parts.append(f"{word}{'s' if len(names) > 1 else ''} for {', '.join(names)}")
    return "; ".join(parts) or "no replacement"


def _label_end_to_end(ev: Evaluation, kept: list[OpResult]) -> dict[str, list[str]]:
    """The engine judges the integrated file by its own text, which loads the kernels by path
    and holds none: it would read "a PyTorch rewrite (no custom kernel)" whatever the ops hold.
    Say what it holds instead, op by op."""
    held = holds(kept)
    if ev.custom_kernel is False and ev.message.endswith(f"; a {PYTORCH_REWRITE}"):
        ev.message = ev.message[: -len(f"; a {PYTORCH_REWRITE}")]
    if kept:
        ev.custom_kernel = bool(held["custom_kernel"])  # the model's speed comes from a kernel of its own
        if ev.verdict == "correct":
            ev.message += f"; the model holds: {holds_label(held)}"
    return held


async def _end_to_end(engine: Any, task: Task, source: str, opts: WholeModelOptions,
                      reference: list[Evaluation], kept: list[OpResult] | None = None
                      ) -> tuple[Evaluation, dict[str, Any]]:
    cand = Candidate(source=source, kind="python", origin="whole-model", note="integrated model")
    ev = await engine.evaluate(task, cand, checks=("compile", "verify", "bench"), timeout=opts.eval_timeout,
                               options=opts.end_to_end_options)
    held = _label_end_to_end(ev, kept or [])
    eager = ev.eager
    spread_base = ev.eager
    if eager is None and ev.time is not None:  # baselines off: time the original model itself
        if not reference:
            # The model itself as a Candidate: timed the same way, without the baselines asked off.
            reference.append(await engine.evaluate(
                task, _reference_as_start(task), checks=("compile", "verify", "bench"),
                timeout=opts.eval_timeout, options=opts.end_to_end_options))
        eager = spread_base = reference[0].time
    bad = sorted(set(ev.flags) & END_TO_END_BAD_FLAGS)
    s_eager = _speedup_vs(eager, ev.time)
    limit = None
    if ev.time is not None and spread_base is not None:
        limit = 1.0 + max(0.02, 2.0 * max(ev.time.spread_pct, spread_base.spread_pct) / 100)
    doc = {"correct": ev.verdict == "correct" and not bad, "verdict": ev.verdict if not bad else "flagged",
           "bad_flags": bad, "message": ev.message,
           "flags": list(ev.flags), "speedup_eager": s_eager, "speedup_compile": _speedup_vs(ev.compiled, ev.time),
           "time_ms": ev.time.median_ms if ev.time else None, "eager_ms": eager.median_ms if eager else None,
           "compile_ms": ev.compiled.median_ms if ev.compiled else None,
           "spread_pct": ev.time.spread_pct if ev.time else None, "needs": limit,
           "device": (ev.device or {}).get("name"),
           "holds": held, "label": holds_label(held)}
    doc["faster"] = bool(s_eager is not None and limit is not None and s_eager > limit)
    return ev, doc


def _for_op(proposer: Any, start: Any, engine: Any) -> Any:
    """With the tuner (no model configured), an op's module gets the no-LLM writer: the kernels
    torch.compile writes for it, then their launches tuned (kernel_lsp/nollm)."""
    from kernel_lsp.nollm.proposer import for_start

    proposer = for_start(proposer, start)
    if hasattr(proposer, "engine") and proposer.engine is None:
        proposer.engine = engine
    return proposer


async def optimize_model(path: str, engine: Any, store: Any, make_proposer: Callable[[OpResult], Any],
                         options: WholeModelOptions | None = None, *, root: str | None = None,
                         engines: list[Any] | None = None, progress: Progress | None = None) -> WholeModelResult:
    """The whole flow (module docstring). `engines`: one per GPU for concurrent Searches
    (default: `engine` alone). Raises WholeModelError when the model cannot be profiled."""
    from kernel_lsp.engine import find_task
    from kernel_lsp.engine.caller.tasks import TaskError

    opts = options or WholeModelOptions()
    root = os.path.abspath(root or os.getcwd())
    try:
        task, _ = find_task(path)
    except TaskError as exc:
        raise WholeModelError(str(exc)) from None
    await _report(progress, f"profiling {os.path.basename(path)}")
    extraction = await extract_model(engine, task, opts.extract_options, opts.extract_timeout)
    selected = select_ops(extraction, opts.min_share)
    if opts.ops is not None:
        selected = [m for m in select_ops(extraction, 0.0) if m["name"] in opts.ops] or \
                   [{**m, "share": m["inclusive_us"] / (forward_us(extraction) or 1)}
                    for m in extraction["modules"] if m["name"] in opts.ops]
    ops = write_op_tasks(path, root, extraction, selected, task)
    result = WholeModelResult(model=os.path.abspath(path), task=task, ops=ops, extraction=extraction)
    runnable = [o for o in ops if o.task]
    if not ops:
        result.reason = (f"the model has no submodule named {', '.join(opts.ops)}" if opts.ops is not None else
                         f"no submodule takes {100 * opts.min_share:g}% or more of forward")
        _record(store, result, opts)
        return result
    if not runnable:
        result.reason = "no hot op could be extracted as a Task"
        _record(store, result, opts)
        return result
    if not opts.library_ops:
        for o in runnable:
            if opts.ops is None and library_bound(o):
                o.reason = (f"skipped: nn.{o.cls} is one cuBLAS/cuDNN call, already near the GPU's peak "
                            "(set library_ops to search it anyway)")
        runnable = [o for o in runnable if not o.reason.startswith("skipped:")]
        if not runnable:
            result.reason = "every hot op is a library call (a GEMM or convolution); set library_ops to search them"
            _record(store, result, opts)
            return result
    for op, n in zip(runnable, split_budget([o.share for o in runnable], opts.budget, opts.min_proposals)):
        op.budget = n
    await _run_searches(runnable, engines or [engine], store, make_proposer, opts, progress)

    winners: list[OpResult] = []
    for op in runnable:
        s = op.search
        if s is None or not s.improved or s.best is None:
            continue
        assert op.task is not None
        op.kernel = op.task[:-3] + "_new.py"
        with open(op.kernel, "w", encoding="utf-8") as fh:
            fh.write(s.best.source)
        winners.append(op)
    if not winners:
        result.reason = "no op's Search found a verified, faster version"
        _record(store, result, opts)
        return result

    kept = sorted(winners, key=lambda o: -(o.speedup or 0.0))
    reference: list[Evaluation] = []
    model_dir = os.path.dirname(os.path.abspath(path))
    dropped: list[str] = []
    while kept:
        reps = [_replacement(o) for o in kept]
        source = integrated_source(path, os.path.join(model_dir, "_integrated.py"), reps, _summary(kept))
        await _report(progress, f"verifying the model with {len(kept)} replacement(s) end to end")
        ev, doc = await _end_to_end(engine, task, source, opts, reference, kept)
        doc["replacements"] = [o.name for o in kept]  # what this evaluation had in the model
        if doc["correct"] and doc["faster"]:
            result.end_to_end, result.integrated, result.replacements, result.evaluation = doc, source, reps, ev
            break
        worst = kept.pop()
        why = ev.message if not doc["correct"] else (
            f"the model was {doc['speedup_eager']:.3f}x with it (needs > {doc['needs']:.3f})"
            if doc["speedup_eager"] and doc["needs"] else "the model could not be timed")
        worst.reason = f"dropped from the model: {why}"
        dropped.append(worst.name)
        result.end_to_end, result.evaluation = doc, ev
    for op in kept:
        op.kept = True
    if result.replacements:
        e = result.end_to_end or {}
        result.reason = (f"{len(kept)} op(s) replaced ({e.get('label')}); the model is "
                         f"{e.get('speedup_eager', 0):.2f}x eager"
                         + (f", {e['speedup_compile']:.2f}x torch.compile" if e.get("speedup_compile") else ""))
    else:
        result.reason = "no replacement kept the whole model correct and faster (" + ", ".join(dropped) + " dropped)"
    _record(store, result, opts)
    return result


def _replacement(op: OpResult) -> Replacement:
    rec = op.record
    args, kwargs = guard_rule(rec["call"])
    init = rec.get("init")
    usable_init = init is not None and rec["class"]["where"] in ("torch.nn", "model_file", "importable")
    return Replacement(op=op.name, kernel_path=op.kernel or "", init_inputs=[v for _, v in init["args"]]
                       if usable_init and init else [], args=args, kwargs=kwargs, share=op.share,
                       speedup=op.speedup, label=op.label)


def _summary(ops: list[OpResult]) -> list[str]:
    return [f"- {o.name} ({o.cls}): {100 * o.share:.1f}% of forward, "
            f"{o.speedup:.2f}x alone ({o.label}), Search {o.search.search_id if o.search else '-'}"
            for o in ops if o.speedup]


def integrated_text(result: WholeModelResult, out_path: str) -> str:
    """The integrated model's text for `out_path` (its paths relative to it), with its summary."""
    kept = [o for o in result.ops if o.kept]
    return integrated_source(result.model, out_path, result.replacements, _summary(kept))


def write_integrated(result: WholeModelResult, out_path: str, store: Any = None) -> str | None:
    """Write the integrated model to `out_path` (its paths made relative to it); None when
    there is nothing verified to write. With `store`, the run's record notes the file."""
    if not result.replacements:
        return None
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(integrated_text(result, out_path))
    result.written = out_path
    if store is not None and result.record is not None:
        row = store.search(result.record)
        if row is not None:
            store.update_search(result.record, budget={**row["budget"], "whole_model": result.to_dict()})
    return out_path


def _record(store: Any, result: WholeModelResult, opts: WholeModelOptions) -> None:
    """The run in the store: a search row (proposer "whole-model") whose document holds the
    ops and the end-to-end result; the integrated model is its node with its Evaluation."""
    if store is None:
        return
    task = result.task
    root = Candidate(source=task.reference_source, kind="python", origin="reference", note="the model")
    doc = {"whole_model": result.to_dict(), "limits": {"proposals": opts.budget, "min_share": opts.min_share},
           "time": time.time()}
    sid = store.start_search(task.name, root, PROPOSER_NAME, doc)
    result.record = sid
    best = None
    if result.integrated is not None and result.evaluation is not None:
        cand = Candidate(source=result.integrated, kind="python", origin="whole-model", parent=root.id,
                         note="integrated model")
        store.add_node(sid, cand, root.id, 1, 1, "evaluated")
        store.add_evaluation(task.name, result.evaluation, cand)
        best = cand.id
    doc["whole_model"] = result.to_dict()
    store.update_search(sid, budget=doc)
    store.finish_search(sid, "done", best=best, message=result.reason)


async def optimize_op(path: str, op_name: str, engine: Any, store: Any, make_proposer: Callable[[OpResult], Any],
                      options: WholeModelOptions | None = None, *, root: str | None = None,
                      progress: Progress | None = None) -> WholeModelResult:
    """One op of a model (the editor's hot-op action): profile, extract its Task, search it,
    integrate and verify end to end, like `optimize_model` restricted to `op_name`."""
    opts = options or WholeModelOptions()
    opts = WholeModelOptions(**{**opts.__dict__, "ops": [op_name]})
    return await optimize_model(path, engine, store, make_proposer, opts, root=root, progress=progress)


INTEGRATED_MARK = "kernel-lsp optimize"  # in the docstring of every integrated model we write


def optimized_path(model_path: str) -> tuple[str | None, str]:
    """`<model>_optimized.py` beside the model, or (None, why not): never over a file kernel-lsp
    did not write."""
    out = os.path.splitext(os.path.abspath(model_path))[0] + "_optimized.py"
    if os.path.exists(out):
        try:
            with open(out, encoding="utf-8") as fh:
                head = fh.read(600)
        except OSError as exc:
            return None, f"cannot read {out}: {exc}"
        if INTEGRATED_MARK not in head:
            return None, f"{os.path.basename(out)} exists and was not written by kernel-lsp"
    return out, ""
