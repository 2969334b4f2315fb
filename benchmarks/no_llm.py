"""The no-LLM path over the project's module Tasks, on a GPU.

    python benchmarks/no_llm.py [--only relu,softmax] [--limit N] [--budget 24] [--no-max-autotune]
                                [--stop-after SECONDS] [--out benchmarks/results/no_llm] [--resume]
                                [--redo] [--max-autotune-only] [PATH ...]

Per Task (each reference alone in a fresh folder, no ModelNew of its own): `kernel-lsp optimize
TASK --proposer tuner --json` (the Worker records torch.compile's code, the writer makes the
standalone file; the Search then tries eager's ops in place of single kernels, the whole forward in
one CUDA graph and the launch sweep; every candidate verified and timed by the engine, eager and
torch.compile default timed with it), and, after every Task's optimize, in one separate process
for them all, torch.compile max-autotune-no-cudagraphs timed against eager with triton's do_bench
(its own eager, so the ratio is same-method). Reported per Task: eager, torch.compile default and max-autotune, and each kind of
variant the Search evaluated, read from the Task folder's store: the generated file (the default,
max-autotune and variant recordings: inductor_code.VARIANTS), its launch-tuned best, its best with eager ops kept, the CUDA-graph
variant (flagged `cuda_graph` by the engine, so shown but not counted), then what the user keeps,
its label and verdict, and the seconds the Task took. Results are rewritten after every Task and
every max-autotune number (partial results survive a stop; a SIGTERM writes them and exits 143), as
JSON and a Markdown table with the command, and the issue's targets are computed over the Tasks run.

Default Tasks: examples/*.py, benchmarks/tasks/*.py, benchmarks/models/*.py and, where present,
benchmarks/corpus/inline_build/*/reference.py (KernelBench level-1/2 references; one per distinct
reference). Runs under a time limit: `--stop-after` starts no Task past that many seconds, and the
max-autotune stage gets only what is left of it (too little: skipped, the reason in each row's
`max_autotune_skipped`); `--resume` continues where the last run stopped: the Tasks not run yet, and
max-autotune for every kept row still without a number. `--only` runs the named Tasks in the order
given; with `--resume`, `--redo` runs them again (their rows replaced in place, their max-autotune
numbers kept: they depend on the reference alone) and `--max-autotune-only` measures only the
max-autotune numbers still missing (of the `--only` Tasks, in that order, when given).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# torch.compile max-autotune against eager, every Task in one process (one torch import and CUDA
# init for the whole run, not one per Task): one JSON line per Task file given.
MEASURE_MAX = r'''
import importlib.util, json, signal, sys
import torch

def measure(path):
    if not torch.cuda.is_available():
        return {"error": "no CUDA GPU visible: max-autotune is measured on the GPU"}
    from triton.testing import do_bench
    spec = importlib.util.spec_from_file_location(f"ref_{abs(hash(path))}", path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    torch.manual_seed(0)
    model = m.Model(*m.get_init_inputs()).cuda().eval()
    xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in m.get_inputs()]
    with torch.no_grad():
        eager = do_bench(lambda: model(*xs), return_mode="median")
        c = torch.compile(model, mode="max-autotune-no-cudagraphs")
        c(*xs)
        ms = do_bench(lambda: c(*xs), return_mode="median")
    return {"eager_ms": eager, "max_autotune_ms": ms}

def too_long(signum, frame):
    raise TimeoutError("ran past its time")

signal.signal(signal.SIGALRM, too_long)
limit = int(sys.argv[1])
for path in sys.argv[2:]:
    signal.alarm(limit)
    try:
        got = measure(path)
    except BaseException as exc:
        got = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    finally:
        signal.alarm(0)
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(json.dumps({"path": path, **got}), flush=True)
'''


def default_paths() -> list[Path]:
    out = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name != "time_variants.py")
    out += sorted(p for p in (ROOT / "benchmarks" / "tasks").glob("*.py")
                  if not p.stem.endswith("_new") and p.name != "generate.py")
    out += sorted((ROOT / "benchmarks" / "models").glob("*.py"))
    seen: set[str] = set()  # several published solutions share one KernelBench reference: run it once
    for p in sorted((ROOT / "benchmarks" / "corpus" / "inline_build").glob("*/reference.py"),
                    key=lambda p: (p.parent.name.split("_")[0], int(p.parent.name.split("_")[1][1:])
                                   if p.parent.name.split("_")[1][1:].isdigit() else 0, p.parent.name)):
        text = p.read_text()
        if text not in seen:
            seen.add(text)
            out.append(p)
    return out


def task_name(path: Path) -> str:
    return path.parent.name if path.name == "reference.py" else path.stem


def reference_only(path: Path) -> str | None:
    from kernel_lsp.engine.protocol import reference_only_source

    text = path.read_text()
    if "class Model" not in text or "def get_inputs" not in text:
        return None
    return reference_only_source(text)


def run_task(path: Path, budget: int, timeout: float) -> dict:
    name = task_name(path)
    row: dict = {"task": name, "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)}
    ref = reference_only(path)
    if ref is None:
        row["skipped"] = "not a module Task (no Model/get_inputs)"
        return row
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL"):
        env.pop(var, None)
    with tempfile.TemporaryDirectory(prefix="nollm_") as d:
        task = Path(d) / f"{name}.py"
        task.write_text(ref)
        t0 = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "optimize", task.name, "--proposer", "tuner",
                                "--budget", str(budget), "--json", "--out", "best.py"], cwd=d, env=env,
                               capture_output=True, text=True, timeout=timeout)
            row["seconds"] = round(time.perf_counter() - t0, 1)
            row["status"] = r.returncode
            doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
            if not doc:
                row["error"] = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
        except subprocess.TimeoutExpired:
            row["seconds"] = round(time.perf_counter() - t0, 1)
            row["error"] = f"optimize ran past {timeout:g} s"
            doc = {}
        if doc:
            row.update(summarize(doc))
            row.update(variants(Path(d), row.get("eager_ms"), row.get("compile_ms")))
            if not doc.get("improved") and row.get("eager_ms"):
                row["label"] = "eager kept: the reference's own forward (no correct, counted variant beat it)"
    return row


# Below this many seconds of --stop-after left, the max-autotune stage is not started (a torch import,
# CUDA init and one Task's autotuning): its Tasks are marked for the next --resume run instead.
MAX_AUTOTUNE_MIN_S = 60.0


def max_autotune_pending(rows: list[dict]) -> list[dict]:
    """The rows still without a max-autotune number or a reason it has none: those killed or cut by
    the time limit (no key, or ``max_autotune_skipped``) included, kept rows of a --resume too."""
    return [r for r in rows if max_autotune_later(r) and r.get("path")]


# Written by runs before 2026-12-06 where the corpus was not on the machine: a fact about that
# machine, not the Task, so such a row is measured again (now it is marked skipped instead).
NO_REFERENCE = "the Task's reference could not be read"


def max_autotune_later(r: dict) -> bool:
    """Whether a --resume run would still measure this row's max-autotune (not reached, cut by the
    time limit, or an old run's NO_REFERENCE), so the table says "not yet" rather than a bare "-"."""
    return ("skipped" not in r and "max_autotune_vs_eager" not in r
            and r.get("max_autotune_error") in (None, NO_REFERENCE))


def skip_max_autotune(rows: list[dict], why: str) -> None:
    """No time for these now: the reason on each row, and a --resume run measures them."""
    for r in rows:
        r["max_autotune_skipped"] = why
    print(f"max-autotune: skipped for {len(rows)} Task(s): {why}; rerun with --resume to measure them",
          file=sys.stderr, flush=True)


def measure_max_autotune(rows: list[dict], timeout: float, time_left: float | None = None,
                         on_row=lambda: None) -> None:
    """torch.compile max-autotune against its own eager (triton do_bench) for every row that has
    neither yet, all in one process (MEASURE_MAX), after the Tasks' optimizes: run beside them it
    would disturb their timing, and one process per Task paid a torch import and CUDA init each.
    ``time_left`` (what --stop-after leaves): the process is stopped then, and the Tasks it did not
    reach are marked ``max_autotune_skipped`` for a --resume run, not failed. ``on_row()`` after each
    number (the results written: a kill keeps them)."""
    todo = max_autotune_pending(rows)
    if not todo:
        return
    if time_left is not None and time_left < MAX_AUTOTUNE_MIN_S:
        skip_max_autotune(todo, f"{max(0.0, time_left):.0f} s of --stop-after left, "
                                f"{MAX_AUTOTUNE_MIN_S:g} s needed")
        return
    with tempfile.TemporaryDirectory(prefix="nollm_max_") as d:
        files: dict[str, dict] = {}
        for r in todo:
            path = Path(r["path"]) if Path(r["path"]).is_absolute() else ROOT / r["path"]
            ref = reference_only(path) if path.exists() else None
            if ref is None:  # not on this machine (the corpus is fetched separately): a later run may have it
                r.pop("max_autotune_error", None)
                r["max_autotune_skipped"] = f"the Task's reference is not readable here ({r['path']})"
                continue
            f = Path(d) / f"{r['task']}.py"
            f.write_text(ref)
            files[str(f)] = r
        if not files:
            return
        natural = timeout * len(files) + 120
        limit = natural if time_left is None else min(natural, time_left)
        cut = limit < natural  # if stopped, by the budget, not by a hang
        print(f"max-autotune: {len(files)} Task(s) in one process, {limit:.0f} s at most", file=sys.stderr,
              flush=True)
        stopped, why = run_max_autotune(list(files), timeout, limit,
                                        lambda line: take_max_autotune(files, line, on_row))
        if stopped and cut:
            skip_max_autotune(list(files.values()), f"--stop-after ran out after {limit:.0f} s of max-autotune")
        else:
            for r in files.values():  # the process stopped before these
                r["max_autotune_error"] = f"the max-autotune process ran past {limit:g} s" if stopped else why


def run_max_autotune(files: list[str], timeout: float, limit: float, on_line) -> tuple[bool, str]:
    """MEASURE_MAX over ``files``, ``on_line(line)`` for each line as it comes (a number is kept the
    moment it is measured); killed after ``limit`` s. (whether it was killed, its last stderr line)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: a chatty stderr cannot block it
        proc = subprocess.Popen([sys.executable, "-c", MEASURE_MAX, str(max(1, int(timeout))), *files], env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        killed = threading.Event()
        timer = threading.Timer(limit, lambda: (killed.set(), proc.kill()))
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                on_line(line)
            rc = proc.wait()
        finally:  # a SIGTERM (Stopped) included: the process does not outlive this
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return killed.is_set(), (err.read().strip().splitlines() or [f"exit {rc}"])[-1][:200]


def take_max_autotune(files: dict[str, dict], line: str, on_row) -> None:
    """One MEASURE_MAX line into its row (taken out of ``files``: what is left was not reached)."""
    try:
        got = json.loads(line)
    except ValueError:
        return
    r = files.pop(str(got.get("path")), None) if isinstance(got, dict) else None
    if r is None:
        return
    r.pop("max_autotune_skipped", None)
    r.pop("max_autotune_error", None)  # an earlier run's (NO_REFERENCE): this one's answer stands
    if got.get("max_autotune_ms"):
        r["max_autotune_vs_eager"] = got["eager_ms"] / got["max_autotune_ms"]
    else:
        r["max_autotune_error"] = str(got.get("error") or "no time")[:200]
    on_row()


def summarize(doc: dict) -> dict:
    out: dict = {"reason": doc.get("reason"), "eager_ms": doc.get("eager_ms"), "compile_ms": doc.get("compile_ms"),
                 "improved": doc.get("improved"), "label": doc.get("generated") or doc.get("label"),
                 "custom_kernel": doc.get("custom_kernel")}
    rows = doc.get("ranking") or []
    gen = [r for r in rows if str(r.get("note") or "").startswith("Triton kernels generated from torch.compile")
           and "tuned" not in str(r.get("note"))]
    if gen:
        first = min(gen, key=lambda r: r.get("time_ms") or math.inf)
        out["generated_ms"] = first.get("time_ms")
        out["generated_verdict"] = "correct"
    else:
        failed = [s for s in doc.get("failed_steps") or [] if s.get("kind") in ("evaluation", "proposal")]
        out["generated_verdict"] = failed[0].get("verdict") or "not made" if failed else "not made"
        out["generated_why"] = str(failed[0].get("reason"))[:200] if failed else doc.get("reason")
    if doc.get("improved") and doc.get("best_ms"):
        out["best_ms"] = doc.get("best_ms")
    elif gen:
        out["best_ms"] = None  # the generated file did not beat eager: the start stays
    for k in ("eager_ms", "compile_ms", "generated_ms", "best_ms"):
        if out.get(k) is not None:
            out[k] = float(out[k])
    if out.get("eager_ms"):
        for k, name in (("compile_ms", "compile_vs_eager"), ("generated_ms", "generated_vs_eager"),
                        ("best_ms", "best_vs_eager")):
            if out.get(k):
                out[name] = out["eager_ms"] / out[k]
        out["result_vs_eager"] = out.get("best_vs_eager") or 1.0  # never slower than eager: the start stays
    return out


KINDS = ("generated", "tuned", "eager_kept", "graphed")


def kind_of(source: str, note: str) -> str | None:
    """Which variant a stored candidate is: generated (a recording's file as written), tuned (launch
    changes only), eager_kept (some kernel left to eager's ops), graphed (one CUDA graph)."""
    from kernel_lsp.nollm import eager_ops, graphs

    if "LAUNCHERS" not in source and "@triton.jit" not in source:
        return None  # the start: the reference's forward
    if graphs.is_graphed(source):
        return "graphed"
    if eager_ops.kept_count(source):
        return "eager_kept"
    if note.startswith("Triton kernels generated from torch.compile"):
        return "generated"
    return "tuned"


def variants(folder: Path, base_eager_ms: float | None = None, base_compile_ms: float | None = None) -> dict:
    """Each kind of variant's best evaluation in a Task folder's store: time, ratio to the eager and
    torch.compile measured with it, verdict, flags."""
    from kernel_lsp.store import Store, store_path

    path = store_path(folder)
    if not path.exists():
        return {}
    best: dict[str, dict] = {}
    with Store(path) as store:
        for task in store.tasks():
            sources = {c.id: c for c in store.candidates(task.name)}
            for ev in store.evaluations(task.name):
                cand = sources.get(ev.candidate)
                kind = kind_of(cand.source, cand.note or "") if cand is not None else None
                if kind is None:
                    continue
                t = ev.time.median_ms if ev.time else None
                # The baselines measured with this evaluation; where it reused kept ones (the store keeps
                # them once per reference), the Search's own eager and torch.compile (same Task, same run).
                eager_ms = ev.eager.median_ms if ev.eager else base_eager_ms
                compile_ms = ev.compiled.median_ms if ev.compiled else base_compile_ms
                row = {"ms": t, "verdict": ev.verdict, "flags": [f for f in ev.flags if f != "not_counted"],
                       "vs_eager": (eager_ms / t) if t and eager_ms else None,
                       "vs_compile": (compile_ms / t) if t and compile_ms else None,
                       "baselines": "measured with it" if ev.eager else "the Search's", "note": cand.note}
                old = best.get(kind)
                better = old is None or (row["verdict"] == "correct" and (
                    old["verdict"] != "correct" or (t or 1e9) < (old["ms"] or 1e9)))
                if better:
                    best[kind] = row
    return {f"variant_{k}": v for k, v in best.items()}


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


NOISE = 0.05  # "beyond the measured noise": a kept result may read this much under eager's time and
               # still count as eager's (the engine's own guard keeps only measurably faster files)
QUICK_S = 120.0  # the "one Task's no-LLM optimize within 2 minutes on the H200"


def targets(rows: list[dict]) -> dict:
    """The issue's targets over the Tasks run (those torch.compile compiled), each with pass/fail."""
    done = [r for r in rows if "skipped" not in r]
    comp = [r for r in done if r.get("compile_vs_eager")]
    correct = [r for r in comp if any((r.get(f"variant_{k}") or {}).get("verdict") == "correct" for k in KINDS)
               or r.get("generated_verdict") == "correct"]
    slower = [r["task"] for r in done if r.get("result_vs_eager") and r["result_vs_eager"] < 1 - NOISE]
    g_res = geomean([r.get("result_vs_eager") for r in comp])
    g_comp = geomean([r["compile_vs_eager"] for r in comp])
    # Only a kept generated file counts here: eager itself beating torch.compile is not the path's gain.
    past = [r["task"] for r in comp if r.get("best_vs_eager") and r["result_vs_eager"] >= 1.1 * r["compile_vs_eager"]]
    quick = [r for r in done if r.get("seconds") is not None and r["seconds"] <= QUICK_S and not r.get("error")]
    need = math.ceil(len(comp) / 4) if comp else 1
    return {
        "tasks": len(done), "torch_compile_compiled": len(comp),
        "correct_standalone": f"{len(correct)}/{len(comp)}",
        "correct_standalone_ok": bool(comp) and len(correct) >= 0.9 * len(comp),
        "slower_than_eager_beyond_noise": slower, "never_slower_ok": not slower,
        "geomean_result_vs_eager": g_res, "geomean_compile_vs_eager": g_comp,
        "geomean_ok": g_res is not None and g_comp is not None and g_res >= g_comp,
        "at_least_10pct_faster_than_compile": past, "quarter_needed": need, "quarter_ok": len(past) >= need,
        "fastest_task_s": min((r["seconds"] for r in quick), default=None),
        "one_task_within_2_min_ok": bool(quick),
    }


def replace_text(path: Path, text: str) -> None:
    """Write the whole file or nothing: a kill mid-write leaves the last complete one (--resume reads it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write(rows: list[dict], out: Path, command: str, device: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = targets(rows)
    replace_text(out.with_suffix(".json"), json.dumps({"command": command, "device": device, "summary": summary,
                                                       "rows": rows}, indent=1))
    f = lambda v, d=2: "-" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))  # noqa: E731

    def var(r: dict, kind: str) -> str:
        v = r.get(f"variant_{kind}")
        if not v:
            return "-"
        if v["verdict"] != "correct":
            return v["verdict"]
        text = f"{f(v.get('vs_eager'))}x"
        bad = [x for x in v.get("flags") or [] if x in ("cuda_graph", "side_stream", "result_cache")]
        return f"{text} ({', '.join(bad)}: not counted)" if bad else text

    def max_at(r: dict) -> str:  # a number, not yet (time ran out: --resume measures it), or none
        if max_autotune_later(r):
            return "not yet"
        return f"{f(r.get('max_autotune_vs_eager'))}x"

    lines = [f"# The no-LLM path ({device})", "", f"Command: `{command}`", "",
             "Ratios are eager time over the other's time (higher is faster). eager, torch.compile default "
             "and every variant: the engine's timing (CUDA events, L2 flushed, median), each variant against "
             "the eager measured with it; max-autotune: triton do_bench against its own eager in a separate "
             "process; a variant whose evaluation reused the kept baselines is read against the Search's own eager "
             "and torch.compile. Variants (best of each kind the Search evaluated): generated = the file written from a "
             "recording (default, max-autotune or a variant of the default: the label says which), tuned = launch changes only, eager kept = some kernel left "
             "to eager's ATen ops, graphed = the whole forward replayed from one CUDA graph (the engine flags "
             "it `cuda_graph`, so it is shown, never kept). 'result' is what the user keeps: the best counted "
             "variant where it beat eager, else eager itself (1.00x, the reference's forward).", "",
             "| task | eager ms | compile | max-autotune | generated | tuned | eager kept | graphed | result | "
             "verdict | label | s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "skipped" in r:
            continue
        verdict = r.get("generated_verdict") or r.get("error") or "-"
        if r.get("generated_why") and verdict != "correct":
            verdict = f"{verdict}: {r['generated_why'][:90]}"
        lines.append(f"| {r['task']} | {f(r.get('eager_ms'), 4)} | {f(r.get('compile_vs_eager'))}x | "
                     f"{max_at(r)} | {var(r, 'generated')} | {var(r, 'tuned')} | "
                     f"{var(r, 'eager_kept')} | {var(r, 'graphed')} | {f(r.get('result_vs_eager'))}x | {verdict} | "
                     f"{(r.get('label') or '-')[:120]} | {f(r.get('seconds'), 0)} |")
    t = summary
    ok = lambda b: "met" if b else "NOT met"  # noqa: E731
    later = [r["task"] for r in rows if max_autotune_later(r)]
    if later:
        lines += ["", f"max-autotune not measured yet (the time limit ran out, or an earlier run's machine had not the "
                      f"corpus; a --resume run measures them): "
                      f"{', '.join(later)}"]
    lines += ["", "## The issue's targets", "",
              f"- a correct, standalone candidate for at least 90 % of the Tasks torch.compile compiles: "
              f"{t['correct_standalone']} ({ok(t['correct_standalone_ok'])})",
              f"- never slower than eager beyond the noise ({NOISE:.0%}): "
              f"{', '.join(t['slower_than_eager_beyond_noise']) or 'none slower'} ({ok(t['never_slower_ok'])})",
              f"- geometric mean at least torch.compile default's: {f(t['geomean_result_vs_eager'])}x against "
              f"{f(t['geomean_compile_vs_eager'])}x ({ok(t['geomean_ok'])})",
              f"- at least 10 % faster than torch.compile default on a quarter of the Tasks: "
              f"{len(t['at_least_10pct_faster_than_compile'])} of {t['quarter_needed']} needed "
              f"({', '.join(t['at_least_10pct_faster_than_compile']) or '-'}) ({ok(t['quarter_ok'])})",
              f"- one Task's no-LLM optimize within {QUICK_S:.0f} s: fastest {f(t['fastest_task_s'], 0)} s "
              f"({ok(t['one_task_within_2_min_ok'])})", ""]
    replace_text(out.with_suffix(".md"), "\n".join(lines))


class Stopped(Exception):
    """A SIGTERM (`timeout` at a time cap): main writes the rows so far and ends."""


def stop_on_sigterm(signum: int, frame) -> None:
    raise Stopped(f"signal {signum}")  # out of the running Task's subprocess.run, which kills its child


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--only", default="", help="comma-separated task names")
    ap.add_argument("--limit", type=int, default=0)
    # `kernel-lsp optimize`'s own default: the table is what a user running it gets (runs before
    # 2026-12-06 used 8, and most rows that gained stopped at that budget).
    ap.add_argument("--budget", type=int, default=24,
                    help="proposals per Task (1-2 generated files, then eager-kept, graphed and launch variants; "
                         "default 24, kernel-lsp optimize's)")
    ap.add_argument("--stop-after", type=float, default=0.0,
                    help="start no new Task after this many seconds (keeps one run under a time limit)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per Task's optimize")
    ap.add_argument("--no-max-autotune", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "no_llm"))
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out and skip their Tasks")
    ap.add_argument("--redo", action="store_true",
                    help="with --resume and --only: run those Tasks again, their rows replaced in place")
    ap.add_argument("--max-autotune-only", action="store_true",
                    help="with --resume: no optimize, only the max-autotune numbers still missing")
    a = ap.parse_args(argv)
    if (a.redo or a.max_autotune_only) and not a.resume:
        print("no_llm: --redo and --max-autotune-only work on the rows of --out: add --resume", file=sys.stderr)
        return 2
    if a.redo and not a.only:
        print("no_llm: --redo needs --only (the Tasks to run again)", file=sys.stderr)
        return 2
    paths = [Path(p).resolve() for p in a.paths] or default_paths()
    order: list[str] = [n for n in a.only.split(",") if n] if a.only else []
    if order:
        names = {task_name(p) for p in paths}
        unknown = [n for n in order if n not in names]
        if unknown and not a.max_autotune_only:
            print(f"no_llm: no such Task: {', '.join(unknown)} (names are the table's first column)", file=sys.stderr)
            return 2
        paths = sorted((p for p in paths if task_name(p) in order), key=lambda p: order.index(task_name(p)))
    given = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/no_llm.py " + " ".join(shlex.quote(x) for x in given)
    try:
        import torch
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        device += f", torch {torch.__version__}"
    except ImportError:
        device = "no torch"
    rows: list[dict] = []
    out = Path(a.out)
    if a.resume and out.with_suffix(".json").exists():  # runs under a time limit add up
        old = json.loads(out.with_suffix(".json").read_text())
        rows = list(old.get("rows") or [])
        command = old.get("command", command) + f" ; {command}"
        done = {r["task"] for r in rows if not (a.redo and r["task"] in order)}
        paths = [p for p in paths if task_name(p) not in done]
    if a.limit:  # after --resume: each run takes the next N
        paths = paths[: a.limit]
    if a.max_autotune_only:
        paths = []
    before = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        run_all(paths, rows, a, lambda: write(rows, out, command, device), order)
    except Stopped:
        print("stopped by SIGTERM: the rows so far are written; rerun with --resume for the rest",
              file=sys.stderr, flush=True)
        return 143
    finally:
        signal.signal(signal.SIGTERM, before)
        write(rows, out, command, device)
    return 0


def run_all(paths: list[Path], rows: list[dict], a: argparse.Namespace, save, order: list[str] = ()) -> None:
    """Each Task's optimize, then max-autotune for the rows still without it, all within --stop-after
    (no Task started past it, max-autotune only in what it leaves); ``save()`` after each row and
    each max-autotune number, so a kill keeps them and --resume goes on from there. A row run
    again (--redo) takes its old place and keeps its max-autotune numbers. ``order`` (--only's
    names): max-autotune for those rows alone, in that order."""
    began = time.perf_counter()
    for p in paths:
        if a.stop_after and time.perf_counter() - began > a.stop_after:
            print(f"stopping: {a.stop_after:g} s spent; rerun with --resume for the rest", file=sys.stderr)
            break
        row = run_task(p, a.budget, a.timeout)
        at = next((i for i, r in enumerate(rows) if r["task"] == row["task"]), None)
        if at is None:
            rows.append(row)
        else:
            old = rows[at]
            row.update({k: v for k, v in old.items() if k.startswith("max_autotune") and k not in row})
            rows[at] = row
        print(json.dumps(row), flush=True)
        save()
    if not a.no_max_autotune:
        left = a.stop_after - (time.perf_counter() - began) if a.stop_after else None
        chosen = sorted((r for r in rows if r["task"] in order), key=lambda r: order.index(r["task"])) if order else rows
        measure_max_autotune(chosen, a.timeout, left, save)


if __name__ == "__main__":
    raise SystemExit(main())
