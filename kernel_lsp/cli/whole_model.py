"""`kernel-lsp optimize MODEL.py --whole-model`: a Task per hot op, a Search each, the
winners put back behind guards, the model verified end to end (agent/whole_model.py).

Writes the op Tasks under `.kernel-lsp/ops/` (always: they are the user's to bench and
optimize), and the integrated model only when it is verified correct and faster end to end:
to `--out FILE`, else to `<model>_optimized.py` beside the model (never over a file that
kernel-lsp did not write, never over the model itself). Exit codes: 0 improved end to end;
1 ran, no improvement; 2 could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any



def _engines(settings: Any, timeout: float) -> list[Any]:
    """One Engine per configured device ("0,1": two GPUs, Searches run concurrently)."""
    from kernel_lsp.engine import Engine

    devices = [d.strip() for d in str(getattr(settings, "device", None) or "").split(",") if d.strip()] or [None]
    return [Engine(store=None, python=getattr(settings, "python", None), device=d, timeout=timeout)
            for d in devices]


def _target_path(ns: argparse.Namespace, model: str) -> tuple[str | None, str]:
    """Where the integrated model may go, or (None, why not)."""
    if getattr(ns, "out", None):
        out = os.path.abspath(ns.out)
        if out == os.path.abspath(model):
            return None, "--out names the model itself: the integrated model imports it, pick another file"
        return out, ""
    from kernel_lsp.agent.whole_model import optimized_path

    out, why = optimized_path(model)
    if out is None and "not written by kernel-lsp" in why:
        why += ": pass --out FILE"
    return out, why


def _summary(doc: dict[str, Any]) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console()
    title = f"{os.path.basename(doc['model'])} on {doc.get('device')}: forward {doc.get('total_ms', 0):.3f} ms"
    t = Table(title=title)
    for col in ("op", "class", "share", "budget", "speedup", "vs compile", "kind", "in model", "note"):
        t.add_column(col)
    for op in doc["ops"]:
        t.add_row(op["name"], op["class"], f"{100 * op['share']:.1f}%", str(op["budget"]),
                  (f"{op['speedup']:.2f}x" + (f" ±{op['spread_pct']:.0f}%" if op.get("spread_pct") is not None else ""))
                  if op["speedup"] else "-",
                  f"{op['speedup_compile']:.2f}x" if op.get("speedup_compile") else "-",
                  op["label"] or "-", "yes" if op["kept"] else "no", (op["reason"] or "")[:60])
    console.print(t)
    if doc.get("unattributed_share"):
        console.print(f"Model.forward's own code (no submodule): {100 * doc['unattributed_share']:.1f}%",
                      highlight=False)
    e = doc.get("end_to_end")
    if e:
        verdict = "correct" if e["correct"] else f"NOT counted ({e['verdict']}" + (
            f": {', '.join(e['bad_flags'])})" if e.get("bad_flags") else ")")
        line = f"end to end: {verdict}" + (f" ({e['label']})" if e.get("label") else "") + (
            f", {e['speedup_eager']:.2f}x eager" if e.get("speedup_eager") else "")
        if e.get("speedup_compile"):
            line += f", {e['speedup_compile']:.2f}x torch.compile"
        if e.get("spread_pct") is not None:
            line += f" (spread {e['spread_pct']:.1f}%)"
        if e["correct"] and not e.get("faster") and e.get("needs"):
            line += f"; not kept: it needs > {e['needs']:.2f}x to count (2x the spread)"
        console.print(line, highlight=False)
    console.print(doc["reason"] + (f"; record {doc['record']} (kernel-lsp report {doc['record']})"
                                   if doc.get("record") else ""), highlight=False)


async def _run(ns: argparse.Namespace, path: str, show: bool) -> Any:
    from kernel_lsp.agent.search import SearchOptions
    from kernel_lsp.agent.whole_model import WholeModelOptions, optimize_model
    from kernel_lsp.cli.optimize import _make_proposer, _settings
    from kernel_lsp.store import Store

    root = os.getcwd()
    settings = _settings(root)
    min_share = getattr(ns, "min_share", None)
    if min_share is None:
        min_share = float(getattr(settings, "whole_model_min_share", 0.05) or 0.05)
    engines = _engines(settings, float(getattr(ns, "timeout", None) or 300.0))
    e2e = None if getattr(ns, "baselines", True) else {"baselines": False}
    search = SearchOptions()
    if e2e is not None:
        search.start_engine_options = {"baselines": False}
    opts = WholeModelOptions(min_share=min_share, budget=int(getattr(ns, "budget", None) or 24), search=search,
                             end_to_end_options=e2e, ops=[ns.op_name] if getattr(ns, "op_name", None) else None,
                             library_ops=bool(getattr(ns, "library_ops", False)))

    def progress(msg: str) -> None:
        if show:
            print(f"kernel-lsp: {msg}", file=sys.stderr, flush=True)

    store = Store.for_workspace(root)
    try:
        return await optimize_model(path, engines[0], store, lambda op: _make_proposer(ns, settings), opts,
                                    root=root, engines=engines, progress=progress)
    finally:
        for e in engines:
            await e.aclose()


def whole_model_main(ns: argparse.Namespace) -> int:
    from kernel_lsp.agent.whole_model import WholeModelError, write_integrated

    from kernel_lsp.cli.optimize import _split_target

    path, op_name = _split_target(ns.target)
    ns.op_name = op_name  # PATH:OP optimizes that op alone (the submodule's qualified name)
    if not os.path.exists(path):
        print(f"kernel-lsp optimize: no such file: {path}", file=sys.stderr)
        return 2
    if getattr(ns, "apply", False):
        print("kernel-lsp optimize: --whole-model does not rewrite the model in place (the integrated model "
              "imports it); use --out FILE or the default <model>_optimized.py", file=sys.stderr)
        return 2
    out, why_not = _target_path(ns, path)
    if out is None:
        print(f"kernel-lsp optimize: {why_not}", file=sys.stderr)
        return 2
    as_json = bool(getattr(ns, "json", False))
    try:
        result = asyncio.run(_run(ns, path, show=not as_json))
    except KeyboardInterrupt:
        print("kernel-lsp optimize: cancelled; what was evaluated is in the store", file=sys.stderr)
        return 130
    except WholeModelError as exc:
        print(f"kernel-lsp optimize: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # an endpoint or store failure: one clear line, no traceback
        print(f"kernel-lsp optimize: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if result.improved:
        from kernel_lsp.store import Store

        write_integrated(result, out, Store.for_workspace(os.getcwd()))
    doc = result.to_dict()
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        _summary(doc)
        if result.written:
            print(f"wrote the integrated model to {result.written}")
    return 0 if result.improved else 1
