"""Cold build time of KernelBench-format candidates: the default load_inline build against the
split fast path (issue 9).

    python benchmarks/inline_build.py FOLDER [--jobs N] [--run-jobs N] [--only a,b] [--budget-s S]
                                             [--out-dir benchmarks/results] [--no-run]

FOLDER holds one folder per candidate: ``model_new.py`` (a ``ModelNew`` that builds CUDA with
``load_inline``), ``reference.py`` (the KernelBench problem: ``Model``, ``get_inputs``,
``get_init_inputs``) and optionally ``origin.json`` (``benchmarks/gather_inline_corpus.py``
writes them from ``benchmarks/inline_build_manifest.json``).

1. The precompiled torch header the fast path uses is made once (it is kept per torch version in
   the build cache, like the engine keeps it); its time is reported apart.
2. Every candidate is built cold twice, each in a fresh build cache (``KERNEL_LSP_CACHE``) in its own
   process: the fast path (``KERNEL_LSP_FAST_INLINE=1``) and the default path (``=0``, plain
   ``load_inline``). ``--jobs`` builds run at once (default: CPU cores // 2 for default builds, whose
   two compilers each take a core, and cores // 3 for fast builds, which run three); the output says
   both. A build's time is the extension build the engine records (CompileResult.seconds), the
   process's wall time beside it.
3. On a GPU (unless ``--no-run``): each candidate's two builds are loaded from their caches in two
   processes that run the engine's Worker-side ``run.evaluate`` (checks compile + verify, the
   verdict) and ``ModelNew`` on the same inputs (seed 0); same_verdict says the verdicts match and
   same_output that the outputs are equal (torch.equal; else the max abs difference is shown).
   The default build runs a second time: where its own verdict or output differs between the two
   runs (``default_repeatable: false``), a fast-vs-default difference is the candidate's, not the
   fast path's, and is reported but not counted as a change.

Writes ``OUT/inline_build.json`` ({device, command, candidates: [{name, origin, fast_path,
fallback_reason, default_s, fast_s, same_verdict, ...}], summary}) and ``OUT/inline_build.md``, and
prints the table. Targets: fast path taken on >= 80 %, median cold fast build <= 8 s where taken,
no verdict changes.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "benchmarks" / "results"
TARGETS = {"fast_share": 0.80, "median_fast_s": 8.0}
_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[inline_build {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# -- children (one process per build / run: a fresh interpreter, as the build pool uses) --------------


def child_pch() -> dict[str, Any]:
    from kernel_lsp.engine.worker.build import build, fastbuild

    t0 = time.perf_counter()
    flags = fastbuild.torch_flags(build._find_nvcc(None))
    # The light headers the units are built against, and the full one for units that need it.
    out: dict[str, Any] = {"ok": True, "reason": "", "seconds": 0.0, "headers": {}}
    kinds = (("host", (fastbuild.LIGHT_HOST,)), ("main", (fastbuild.LIGHT_MAIN,)),
             ("full", (fastbuild.PCH_HEADER, fastbuild.PCH_MINIMAL)))
    # Made at once, as the engine makes the two light ones (the full one is only made when needed).
    with cf.ThreadPoolExecutor(len(kinds)) as pool:
        made = list(pool.map(lambda kh: fastbuild.ensure_pch(flags, headers=kh[1]), kinds))
    for (kind, _), (pch, why, secs) in zip(kinds, made):
        out["headers"][kind] = {"ok": pch is not None, "reason": why, "seconds": round(secs, 2)}
        out["seconds"] += secs
        out["ok"] = out["ok"] and pch is not None
        out["reason"] = out["reason"] or why
    out["wall"] = time.perf_counter() - t0
    return out


def child_build(src: str) -> dict[str, Any]:
    from kernel_lsp.engine.worker.build import build

    import torch.utils.cpp_extension  # noqa: F401  - a per-process cost, not the build's

    t0 = time.perf_counter()
    text = Path(src).read_text()
    build.install_hooks()
    with build.capture() as records:
        result = build.build_python(text, src)
    exts = [r for r in records]
    # What each fast build did (kept beside the build in the cache): step seconds, and the
    # units that needed the full torch header.
    notes = []
    for d in sorted((build.cache_root() / "ext").glob("*/.kernel-lsp-fast.json")):
        with contextlib.suppress(OSError, ValueError):
            notes.append(json.loads(d.read_text()))
    # The module's import with its extensions built (at once where there are several; torch
    # already imported): what a candidate's cold build costs.
    return {
        "ok": result.ok, "wall": time.perf_counter() - t0,
        "seconds": result.seconds, "extensions": len(exts),
        "sum_extension_s": sum(r.seconds for r in exts),
        "steps": [n.get("steps", {}) for n in notes],
        "full_header": sorted({u for n in notes for u in n.get("full_header", [])}),
        "fast_path": bool(exts) and all(r.fast_path for r in exts),
        "fallback_reason": "; ".join(r.fallback_reason for r in exts if r.fallback_reason),
        "error": "" if result.ok else (result.diagnostics[0].message if result.diagnostics else result.log[-300:]),
    }


def child_run(src: str, ref: str, out_pt: str) -> dict[str, Any]:
    import torch

    from kernel_lsp.engine.worker.build import build
    from kernel_lsp.engine.worker import run
    from kernel_lsp.model import Candidate, Task

    text = Path(src).read_text()
    task = Task(name=Path(src).parent.name, reference_path=ref, reference_source=Path(ref).read_text())
    ev = run.evaluate(task, Candidate(source=text, kind="python"), ["compile", "verify"], {}, build)
    res: dict[str, Any] = {"verdict": ev.verdict, "correct": ev.correct, "message": (ev.message or "")[:300],
                           "fast_path": bool(ev.compile and ev.compile.fast_path),
                           "cached": bool(ev.compile and ev.compile.cached)}
    try:
        ref_ns: dict[str, Any] = {"__name__": "reference"}
        exec(compile(Path(ref).read_text(), ref, "exec"), ref_ns)
        module, cres = build.load_python(text, src)
        if module is None:
            res["output_error"] = "does not load"
            return res
        torch.manual_seed(0)
        init = ref_ns["get_init_inputs"]()
        model = module.ModelNew(*init).cuda()
        torch.manual_seed(1)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref_ns["get_inputs"]()]
        with torch.no_grad():
            out = model(*inputs)
        torch.cuda.synchronize()
        outs = out if isinstance(out, (tuple, list)) else [out]
        torch.save([o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in outs], out_pt)
    except Exception as exc:  # noqa: BLE001 - the candidate's own failure is a result
        res["output_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return res


def split_only(cands: list[dict[str, Any]], out_dir: Path, argv: list[str]) -> int:
    """No compilers, no GPU: what the split decides for each candidate (its extensions' CUDA sources,
    captured by running model_new.py with load_inline replaced by a recorder)."""
    import inspect

    from torch.utils import cpp_extension

    from kernel_lsp.engine.worker.build import inline_split

    real = cpp_extension.load_inline
    sig = inspect.signature(getattr(real, "_klsp_real", real))
    rows = []
    for c in cands:
        seen: list[dict[str, Any]] = []

        def record(*a: Any, **k: Any) -> Any:
            b = sig.bind(*a, **k)
            b.apply_defaults()
            seen.append(dict(b.arguments))
            return type("NoExtension", (), {"__getattr__": lambda self, n: (lambda *x, **y: None)})()

        cpp_extension.load_inline = record
        try:
            exec(compile(Path(c["src"]).read_text(), c["src"], "exec"), {"__name__": "candidate"})
        except Exception as exc:  # noqa: BLE001 - reported per candidate
            rows.append({"name": c["name"], "origin": c["origin"], "fast_path": False,
                         "fallback_reason": f"model_new.py raised {type(exc).__name__}: {exc}"[:200]})
            continue
        finally:
            cpp_extension.load_inline = real
        reasons = []
        for a in seen:
            raw = a.get("cuda_sources") or []
            text = "\n".join([raw] if isinstance(raw, str) else list(raw))
            if not text.strip():
                reasons.append("no CUDA sources")
                continue
            sp = inline_split.split("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + text)
            if not sp.ok:
                reasons.append(sp.fallback_reason)
        rows.append({"name": c["name"], "origin": c["origin"], "extensions": len(seen),
                     "fast_path": bool(seen) and not reasons, "fallback_reason": "; ".join(reasons)})
    taken = sum(r["fast_path"] for r in rows)
    res = {"device": "CPU only: the split's decision, no builds", "command": "python " + " ".join(
        shlex.quote(a) for a in [str(Path(__file__).relative_to(ROOT)), *argv]), "candidates": rows,
        "summary": {"candidates": len(rows), "split": taken, "split_share": taken / len(rows) if rows else 0.0}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "inline_build_split.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = ["# The split's decision for each candidate (CPU, no builds)", "",
             f"Command: `{res['command']}`. Build times and verdicts need the GPU run (`inline_build.md`).", "",
             f"- split into device + host units: {taken}/{len(rows)} ({100 * res['summary']['split_share']:.0f} %); "
             "a build can still fall back if a unit does not compile", "",
             "| candidate | split | fallback reason |", "| --- | --- | --- |"]
    lines += [f"| {r['name']} | {'yes' if r['fast_path'] else 'no'} | {r['fallback_reason'].replace('|', '/')} |"
              for r in rows]
    md = "\n".join(lines) + "\n"
    (out_dir / "inline_build_split.md").write_text(md)
    print(md)
    return 0


def child_main(argv: list[str]) -> int:
    kind = argv[0]
    try:
        data = {"pch": lambda: child_pch(), "build": lambda: child_build(argv[1]),
                "run": lambda: child_run(argv[1], argv[2], argv[3])}[kind]()
    except Exception as exc:  # noqa: BLE001
        data = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    print("KLSP_RESULT " + json.dumps(data), flush=True)
    return 0


def spawn(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"ran past {timeout:.0f} s", "wall": time.perf_counter() - t0}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("KLSP_RESULT "):
            return json.loads(line[len("KLSP_RESULT "):])
    tail = (proc.stderr or proc.stdout)[-400:]
    return {"ok": False, "error": f"exit {proc.returncode}: {tail}", "wall": time.perf_counter() - t0}


def child_env(cache: Path, pch: Path, fast: bool, arch: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"KERNEL_LSP_CACHE": str(cache), "KERNEL_LSP_PCH_CACHE": str(pch),
                "KERNEL_LSP_FAST_INLINE": "1" if fast else "0", "KERNEL_LSP_ARCH": arch,
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "PYTHONUNBUFFERED": "1"})
    return env


# -- the measurement -----------------------------------------------------------------------------------


def discover(folder: Path, only: set[str]) -> list[dict[str, Any]]:
    out = []
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        if only and d.name not in only:
            continue
        if not (d / "model_new.py").exists() or not (d / "reference.py").exists():
            continue
        origin: Any = ""
        if (d / "origin.json").exists():
            o = json.loads((d / "origin.json").read_text())
            origin = {"repo": o.get("repo"), "path": o.get("path"), "commit": o.get("commit"),
                      "author": o.get("author"), "tags": o.get("tags", [])}
        out.append({"name": d.name, "origin": origin, "src": str(d / "model_new.py"), "ref": str(d / "reference.py")})
    return out


def gpu_arch() -> tuple[str, str, bool]:
    """(arch, device name, has GPU) without importing torch here."""
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        if q.returncode == 0 and q.stdout.strip():
            name, cap = [x.strip() for x in q.stdout.strip().splitlines()[0].split(",")]
            return "sm_" + cap.replace(".", ""), name, True
    except (OSError, subprocess.TimeoutExpired):
        pass
    return os.environ.get("KERNEL_LSP_ARCH", "sm_90"), "no GPU", False


def compare(a: str, b: str) -> tuple[bool | None, str]:
    if not (os.path.exists(a) and os.path.exists(b)):
        return None, "no output"
    import torch

    x, y = torch.load(a), torch.load(b)
    if len(x) != len(y):
        return False, "different number of outputs"
    worst = 0.0
    for u, v in zip(x, y):
        if isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor):
            if u.shape != v.shape or u.dtype != v.dtype:
                return False, "different shapes or dtypes"
            # bit-for-bit, NaN where the other has NaN counting as equal
            if not (u.is_floating_point() and torch.allclose(u, v, rtol=0.0, atol=0.0, equal_nan=True)) \
                    and not torch.equal(u, v):
                diff = (u.double() - v.double()).abs()
                if u.is_floating_point():
                    diff = diff.masked_fill(u.isnan() & v.isnan(), 0.0)  # NaN in both: the same
                worst = max(worst, float(diff.nan_to_num(float("inf")).max()))
        elif u != v:
            return False, "different values"
    return worst == 0.0, ("equal" if worst == 0.0 else f"max abs diff {worst:.3g}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--jobs", type=int, default=0, help="builds at once (default: by CPU cores, see above)")
    ap.add_argument("--default-jobs", type=int, default=0, help="default builds at once (default: --jobs)")
    ap.add_argument("--run-jobs", type=int, default=6, help="GPU verify processes at once")
    ap.add_argument("--only", default="")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no new work after this")
    ap.add_argument("--build-timeout", type=float, default=300.0)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-run", action="store_true", help="builds only (no GPU)")
    ap.add_argument("--split-only", action="store_true",
                    help="no builds: what the split decides per candidate (CPU; writes inline_build_split.*)")
    ap.add_argument("--work", type=Path, help="work folder, kept: a later run with the same folder reuses the "
                    "builds measured there (to split the measurement over several calls)")
    ap.add_argument("--pch-dir", type=Path, help="where the precompiled torch header is kept (default: fresh)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"{args.folder}: not a folder of candidates", file=sys.stderr)
        return 2
    cands = discover(args.folder, {s for s in args.only.split(",") if s})
    if not cands:
        print(f"{args.folder}: no <name>/model_new.py + reference.py", file=sys.stderr)
        return 2
    if args.split_only:
        return split_only(cands, args.out_dir, argv)
    arch, device, has_gpu = gpu_arch()
    do_run = has_gpu and not args.no_run
    cores = os.cpu_count() or 2
    jobs_fast = args.jobs or max(1, cores // 3)
    jobs_default = args.default_jobs or args.jobs or max(1, cores // 2)
    work = args.work or Path(tempfile.mkdtemp(prefix="klsp-inline-build-"))
    for sub in ("fast", "default"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    pch_dir = args.pch_dir or (work / "pch")
    deadline = time.monotonic() + args.budget_s
    log(f"{len(cands)} candidates, {cores} cores, fast builds {jobs_fast} at once, default builds {jobs_default} "
        f"at once, arch {arch}, work in {work}")
    res: dict[str, Any] = {
        "device": f"{device}, {cores} CPU cores, {platform.node()}",
        "command": "python " + " ".join(shlex.quote(a) for a in [str(Path(__file__).relative_to(ROOT)), *argv]),
        "concurrency": {"fast_builds": jobs_fast, "default_builds": jobs_default, "runs": args.run_jobs},
        "candidates": [],
    }
    pch = spawn(["pch"], child_env(work / "pch-cache", pch_dir, True, arch), 900)
    res["pch"] = pch
    log(f"precompiled torch header: {pch}")
    rows = {c["name"]: {"name": c["name"], "origin": c["origin"], "fast_path": False, "fallback_reason": "",
                        "default_s": None, "fast_s": None, "same_verdict": None} for c in cands}

    def build(c: dict[str, Any], fast: bool) -> None:
        row = rows[c["name"]]
        if time.monotonic() > deadline:
            row[f"{'fast' if fast else 'default'}_error"] = "not run: time budget spent"
            return
        cache = work / ("fast" if fast else "default") / c["name"]
        kept = cache.with_name(c["name"] + ".build.json")  # --work: a build measured before is kept
        if kept.exists():
            r = json.loads(kept.read_text())
        else:
            r = spawn(["build", c["src"]], child_env(cache, pch_dir, fast, arch), args.build_timeout)
            if r.get("ok") or r.get("error"):
                kept.write_text(json.dumps(r))
        key = "fast" if fast else "default"
        row[f"{key}_s"] = round(r["seconds"], 2) if r.get("ok") else None
        row[f"{key}_wall_s"] = round(r.get("wall", 0.0), 2)
        if not r.get("ok"):
            row[f"{key}_error"] = str(r.get("error", ""))[:300]
        if fast:
            row["fast_path"] = bool(r.get("ok") and r.get("fast_path"))
            row["fallback_reason"] = r.get("fallback_reason", "") or ("" if r.get("ok") else row.get("fast_error", ""))
            row["extensions"] = r.get("extensions")
            row["fast_steps"] = r.get("steps")
            row["full_header"] = r.get("full_header")
        log(f"{key:7s} {c['name']}: {row[f'{key}_s']} s  fast_path={r.get('fast_path')} "
            f"{(r.get('fallback_reason') or r.get('error') or '')[:120]}")

    for fast, jobs in ((True, jobs_fast), (False, jobs_default)):
        with cf.ThreadPoolExecutor(jobs) as pool:
            list(pool.map(lambda c: build(c, fast), cands))

    if do_run:
        def verify(c: dict[str, Any]) -> None:
            row = rows[c["name"]]
            if time.monotonic() > deadline + 120:
                row["run_error"] = "not run: time budget spent"
                return
            if row["default_s"] is None or row["fast_s"] is None:
                row["run_error"] = "not run: a build is missing"
                return
            outs = {}
            # The default build runs twice: a candidate whose own output or verdict changes from one
            # run to the next (a race, uninitialised memory, float atomics) shows it there, and
            # its fast-vs-default difference is then not counted as a change the fast path made.
            for key, fast, folder in (("default", False, "default"), ("fast", True, "fast"),
                                      ("default_again", False, "default")):
                pt = str(work / f"{c['name']}.{key}.pt")
                r = spawn(["run", c["src"], c["ref"], pt], child_env(work / folder / c["name"], pch_dir, fast, arch), 300)
                outs[key] = (r, pt)
                row[f"{key}_verdict"] = r.get("verdict") or ("error: " + str(r.get("error", ""))[:200])
                row[f"{key}_message"] = str(r.get("message") or r.get("output_error") or "")[:300]
                row[f"{key}_cached"] = r.get("cached")
            same, why = compare(outs["default"][1], outs["fast"][1])
            again, why_again = compare(outs["default"][1], outs["default_again"][1])
            row["same_output"], row["output_note"] = same, why
            row["default_repeatable"] = again is not False and row["default_verdict"] == row["default_again_verdict"]
            if not row["default_repeatable"]:
                row["output_note"] = f"{why}; the default build's own rerun: {row['default_again_verdict']}, output {why_again}"
            row["same_verdict"] = row["default_verdict"] == row["fast_verdict"]
            log(f"run     {c['name']}: {row['default_verdict']} / {row['fast_verdict']} output {row['output_note']}")

        with cf.ThreadPoolExecutor(args.run_jobs) as pool:
            list(pool.map(verify, cands))

    res["candidates"] = [rows[c["name"]] for c in cands]
    res["summary"] = summarize(res["candidates"], do_run)
    write(res, args.out_dir)
    s = res["summary"]
    ok = s["fast_share"] >= TARGETS["fast_share"] and (s["median_fast_s"] or 1e9) <= TARGETS["median_fast_s"] \
        and s["verdict_changes"] == 0 and (do_run or args.no_run)
    return 0 if ok else 1


def summarize(rows: list[dict[str, Any]], ran: bool) -> dict[str, Any]:
    taken = [r for r in rows if r["fast_path"]]
    fast_s = [r["fast_s"] for r in taken if r["fast_s"] is not None]
    default_s = [r["default_s"] for r in rows if r["default_s"] is not None]
    paired = [(r["default_s"], r["fast_s"]) for r in taken if r["default_s"] and r["fast_s"]]
    return {
        "candidates": len(rows), "fast_path": len(taken), "fast_share": len(taken) / len(rows) if rows else 0.0,
        "median_fast_s": statistics.median(fast_s) if fast_s else None,
        "median_default_s": statistics.median(default_s) if default_s else None,
        "median_speedup_x": statistics.median(d / f for d, f in paired) if paired else None,
        "verified": sum(r["same_verdict"] is not None for r in rows) if ran else 0,
        # Changes the fast path made: where the default build gives the same result twice.
        "verdict_changes": sum(r["same_verdict"] is False and r.get("default_repeatable", True) for r in rows),
        "output_changes": sum(r.get("same_output") is False and r.get("default_repeatable", True) for r in rows),
        "not_repeatable": sum(r.get("default_repeatable") is False for r in rows),
        "targets": TARGETS,
    }


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def _pch_parts(res: dict[str, Any]) -> str:
    heads = res.get("pch", {}).get("headers", {})
    return ", ".join(f"{k} {fmt(v.get('seconds'))} s" for k, v in heads.items()) or str(res.get("pch"))


def render(res: dict[str, Any]) -> str:
    s = res["summary"]
    c = res["concurrency"]
    lines = [
        "# Cold builds of KernelBench-format candidates: default load_inline vs the split fast path",
        "",
        f"Device: {res['device']}. Command: `{res['command']}`.",
        f"Concurrency: {c['fast_builds']} fast builds at once, {c['default_builds']} default builds at once "
        f"(each build in a fresh cache and its own process); GPU checks {c['runs']} at once.",
        f"Precompiled torch headers, made once per torch version and kept in the cache (not in the times "
        f"below): {fmt(res.get('pch', {}).get('seconds'))} s in all "
        f"({_pch_parts(res)}): "
        "the host units and main.cpp are built against light headers (host: the tensor API and "
        "CUDA's; main.cpp: pybind), a unit that needs more against the full torch/extension.h.",
        "A candidate's build time is its module's import with its extensions built (several at once), "
        "torch already imported.",
        "",
        f"- fast path taken: {s['fast_path']}/{s['candidates']} ({100 * s['fast_share']:.0f} %; target >= "
        f"{100 * TARGETS['fast_share']:.0f} %)",
        f"- median cold build where taken: {fmt(s['median_fast_s'])} s (target <= {TARGETS['median_fast_s']:.0f} s); "
        f"default path median {fmt(s['median_default_s'])} s; median speedup {fmt(s['median_speedup_x'])}x",
        f"- verdict changes: {s['verdict_changes']} of {s['verified']} checked; output changes: {s['output_changes']}"
        + (f" (not counted: {s['not_repeatable']} candidate(s) whose default build gives another result when "
           "run again)" if s.get("not_repeatable") else ""),
        "",
        "| candidate | extensions | fast path | fallback reason | full torch header for | default s | fast s | "
        "default verdict | fast verdict | same verdict | outputs |",
        "| --- | ---: | --- | --- | --- | ---: | ---: | --- | --- | --- | --- |",
    ]
    for r in res["candidates"]:
        reason = (r.get("fallback_reason") or r.get("fast_error") or "").replace("|", "\\|")[:90]
        lines.append(f"| {r['name']} | {fmt(r.get('extensions'))} | {'yes' if r['fast_path'] else 'no'} | {reason} | "
                     f"{', '.join(r.get('full_header') or []) or '-'} | {fmt(r['default_s'])} | "
                     f"{fmt(r['fast_s'])} | {r.get('default_verdict') or '-'} | {r.get('fast_verdict') or '-'} | "
                     f"{fmt(r['same_verdict'])} | {r.get('output_note') or '-'} |")
    return "\n".join(lines) + "\n"


def write(res: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "inline_build.json").write_text(json.dumps(res, indent=1) + "\n")
    md = render(res)
    (out_dir / "inline_build.md").write_text(md)
    print(md)


if __name__ == "__main__":
    sys.exit(main())
