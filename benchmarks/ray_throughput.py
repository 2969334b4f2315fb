"""Evaluations per minute through the Ray Executor against the local Executor, same candidates (issue 12).

    python benchmarks/ray_throughput.py [--out-dir DIR] [--gpus N] [--quick] [--searches]

Starts a local Ray cluster on 127.0.0.1 (tests/ray/cluster.py: a `ray start --head --block` that
this script stops by pid), with the machine's GPUs (`--num-gpus`, default: what torch sees), or,
on a machine without a GPU, one logical GPU that runs CPU evaluations. Then, on the same
candidates, each from a fresh build cache:

1. local: `LocalExecutor` (one Worker subprocess here), the candidates evaluated as a Search
   does (up to `concurrency` at once: 1, with builds in the CPU pool overlapping);
2. ray: `RayExecutor` on that cluster (GPU actors with warm Workers, builds as CPU tasks),
   up to `concurrency` (= GPU actors) at once.

Candidates: on a GPU, the ten benchmarks/tasks/*.cu (extern "C" launchers: nvcc -shared) with
compile, verify and bench; on a CPU, eight variants of tests/agent/tasks/rowsum_new.py.
Evaluations per minute = 60 * candidates / wall. Target: ray within 10 % of local on one GPU.

The model of 1, 2, 4 and 8 GPUs uses the measured per-candidate costs of the ray run: b = cold
build seconds (a CPU task), g = actor seconds per evaluation (the actor's Evaluation wall, the
build already shipped), o = dispatch overhead (driver wall per evaluation minus g). With N GPU
actors and C build CPUs, evaluations per minute = 60 * min(N / (g + o), C / b): the GPUs are
the limit until builds are. C is reported as measured (this cluster) and as 8 per GPU.
Writes benchmarks/results/ray_throughput.json and .md; prints the table last on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.ray.cluster import LocalCluster, loopback_env  # noqa: E402

TOKEN = os.urandom(16).hex()
os.environ.update(loopback_env(TOKEN))  # before ray is imported: stay on 127.0.0.1

from kernel_lsp.engine.caller.executor import LocalExecutor  # noqa: E402
from kernel_lsp.engine.caller.ray_executor import RayExecutor  # noqa: E402
from kernel_lsp.engine.caller.tasks import find_task  # noqa: E402
from kernel_lsp.model import Candidate, Evaluation, Task  # noqa: E402

ROWSUM = ROOT / "tests" / "agent" / "tasks" / "rowsum_new.py"
LOOP = "        for i in range(x.shape[0]):\n            out[i] = torch.dot(x[i], ones)\n"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def candidates(gpu: bool, quick: bool) -> list[tuple[Task, Candidate]]:
    if gpu:
        out = []
        for cu in sorted((ROOT / "benchmarks" / "tasks").glob("*.cu")):
            task, cand = find_task(str(cu))
            if cand is not None:
                out.append((task, cand))
        return out[:4] if quick else out
    task, start = find_task(str(ROWSUM))
    assert start is not None
    bodies = ["        out = torch.mv(x, ones)\n", "        out = x.sum(dim=1)\n", "        out = x @ ones\n",
              "        out = torch.einsum('ij,j->i', x, ones)\n", "        out = (x * ones).sum(1)\n",
              "        out = torch.matmul(x, ones)\n", "        out = x.sum(-1)\n",
              "        out = torch.mv(x.contiguous(), ones)\n"]
    out = [(task, Candidate(start.source.replace(LOOP, b), "python", origin="tuner", note=b.strip()))
           for b in bodies]
    return out[:3] if quick else out


async def run_all(ex: Any, work: list[tuple[Task, Candidate]], checks: tuple[str, ...],
                  options: dict[str, Any]) -> tuple[float, list[Evaluation], list[float]]:
    gate = asyncio.Semaphore(max(1, ex.concurrency))
    pre: dict[int, asyncio.Future[Any]] = {}

    async def one(i: int, task: Task, cand: Candidate) -> tuple[Evaluation, float]:
        async with gate:
            # Split each evaluation's wall: the wait for its own build (which evaluate would
            # await first anyway), then the evaluation of the built candidate.
            t0 = time.perf_counter()
            if i in pre:
                await asyncio.shield(pre[i])
            waited = time.perf_counter() - t0
            return await ex.evaluate(task, cand, checks, options=options), waited

    # As the Search does: every candidate's build starts at once, evaluations wait for a GPU.
    # Only candidates with something to compile: the same work for both executors.
    from kernel_lsp.engine.caller.client import needs_build

    # Warm both executors' build processes first (Ray starts a worker process per parallel build
    # task; the local pool its processes): throwaway variants, as many as builds will run at once.
    # Without this, on the H200 the Ray run took 4.7 s longer for ten candidates (0.60 of local;
    # with it 0.93): Ray starts a task worker process for each build the first time.
    builds = [w for w in work if needs_build(w[1])]
    warm = [(t, Candidate(c.source + (f"\n// warm-up {i}\n" if c.kind == "cuda" else f"\n# warm-up {i}\n"), c.kind))
            for i, (t, c) in enumerate(builds)]
    if warm:
        await asyncio.gather(*(_quiet(ex.prebuild(t, c, options)) for t, c in warm))
    for i, (task, cand) in enumerate(work):
        if needs_build(cand):
            pre[i] = asyncio.ensure_future(_quiet(ex.prebuild(task, cand, options)))
    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(i, t, c) for i, (t, c) in enumerate(work)))
    return time.perf_counter() - t0, [ev for ev, _ in done], [w for _, w in done]


async def _quiet(coro: Any) -> None:
    try:
        await coro
    except Exception:  # noqa: BLE001 - a prebuild is advisory
        pass


def summarize(name: str, wall: float, evs: list[Evaluation], waits: list[float]) -> dict[str, Any]:
    builds = [ev.compile.seconds for ev in evs if ev.compile is not None and not ev.compile.cached]
    return {
        "executor": name, "candidates": len(evs), "wall_s": round(wall, 3),
        "evals_per_min": round(60 * len(evs) / wall, 2) if wall > 0 else None,
        "verdicts": sorted({ev.verdict for ev in evs}),
        "correct": sum(ev.verdict == "correct" for ev in evs),
        "mean_eval_wall_s": round(statistics.mean(ev.wall_seconds for ev in evs), 3) if evs else None,
        # the part of the wall spent waiting for the candidate's own build (before the evaluation)
        "mean_build_wait_s": round(statistics.mean(waits), 3) if waits else 0.0,
        "max_build_wait_s": round(max(waits), 3) if waits else 0.0,
        "worker_builds_s": round(statistics.mean(builds), 3) if builds else 0.0,
        "nodes": sorted({ev.node or "local" for ev in evs}),
    }


async def main_async(ns: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    gpus = ns.gpus if ns.gpus is not None else gpu_count()
    on_gpu = gpus > 0
    work = candidates(on_gpu, ns.quick)
    checks = ("compile", "verify", "bench")
    options: dict[str, Any] = {"baselines": False}
    if not on_gpu:
        options.update({"device": "cpu", "bench_seconds": 0.3, "cache_probe": False})
    log(f"{len(work)} candidates on {'%d GPU(s)' % gpus if on_gpu else 'the CPU (one logical GPU)'}")
    results.update({"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "host": platform.node(), "python": platform.python_version(), "gpus": gpus,
                    "candidates": len(work), "checks": list(checks), "options": options})

    # 1. local, from a fresh build cache
    with tempfile.TemporaryDirectory(prefix="klsp-bench-local-") as cache:
        env = {"KERNEL_LSP_CACHE": cache}
        if not on_gpu:
            # Ray starts its workers with OMP_NUM_THREADS=1 (an actor asks for no CPU): the same
            # here, or the CPU comparison measures torch's thread count, not the Executor.
            env["OMP_NUM_THREADS"] = "1"
        results["local_env"] = {k: v for k, v in env.items() if k != "KERNEL_LSP_CACHE"}
        local = LocalExecutor(timeout=600, options=options, env=env)
        try:
            info = await local.device_info()
            results["device"] = info.get("name") or "cpu"
            wall, evs, waits = await run_all(local, work, checks, options)
        finally:
            await local.aclose()
    results["local"] = summarize("local", wall, evs, waits)
    log(f"local: {results['local']}")

    # 2. ray, on a fresh local cluster (its GPU node's build cache fresh too)
    cluster = LocalCluster(token=TOKEN)
    try:
        cluster.start_head(num_cpus=os.cpu_count() or 2, num_gpus=max(1, gpus),
                           env={"KERNEL_LSP_CACHE": str(cluster.root / "cache")})
        t0 = time.perf_counter()
        ex = RayExecutor(cluster.address, timeout=600, options=options)
        await ex.connect()
        results["ray_connect_s"] = round(time.perf_counter() - t0, 2)
        try:
            wall, evs, waits = await run_all(ex, work, checks, options)
            results["ray"] = summarize("ray", wall, evs, waits)
            # Per-candidate costs for the model: a cold build as a cluster task, alone.
            build_s = []
            from kernel_lsp.engine.caller.client import needs_build

            for task, cand in [w for w in work if needs_build(w[1])][:3]:
                t1 = time.perf_counter()
                ex._builds.clear()
                await ex.prebuild(task, Candidate(cand.source + "\n// fresh\n" if cand.kind == "cuda"
                                                  else cand.source + "\n# fresh\n", cand.kind), options)
                build_s.append(time.perf_counter() - t1)
            results["build_task_s"] = round(statistics.mean(build_s), 3) if build_s else 0.0
            if ns.searches:
                results["searches"] = []
                await searches(ex, ns.search_budget, results["searches"])
        finally:
            await ex.aclose()
    finally:
        cluster.stop()
    log(f"ray: {results['ray']}")
    results["ray_vs_local"] = round(results["ray"]["evals_per_min"] / results["local"]["evals_per_min"], 3)
    results["model"] = model(results, gpus)
    results["complete"] = True
    return results


async def searches(ex: Any, budget: int, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The examples' Searches (tuner, no LLM) through the Ray Executor: what a user of a GPU box gets."""
    from kernel_lsp.agent.budget import Budget
    from kernel_lsp.agent.search import Search, SearchOptions
    from kernel_lsp.agent.tuner import TunerProposer

    for cu in sorted((ROOT / "examples").glob("*.cu")):
        try:
            task, cand = find_task(str(cu))
        except Exception as exc:  # noqa: BLE001 - reported, the rest still runs
            out.append({"example": cu.name, "error": str(exc)})
            continue
        if cand is None:
            continue
        t0 = time.perf_counter()
        search = Search(ex, None, task, cand, TunerProposer(), SearchOptions(budget=Budget(proposals=budget)))
        nodes: set[str] = set()
        res = await search.run()
        for node in search.nodes.values():
            if node.evaluation is not None:
                nodes.add(f"{node.evaluation.executor}: {node.evaluation.node}")
        out.append({"example": cu.name, "improved": res.improved, "speedup": res.speedup, "confirmed": res.confirmed,
                    "evaluated": res.candidates_evaluated, "reason": res.reason, "wall_s": round(time.perf_counter() - t0, 1),
                    "start_verdict": res.start_evaluation.verdict if res.start_evaluation else None,
                    "ran_on": sorted(nodes)})
        log(f"search {cu.name}: {out[-1]}")
    return out


def model(r: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    ray = r["ray"]
    g = max(1e-6, ray["mean_eval_wall_s"])            # driver wall per evaluation (build shipped)
    per_gpu_eval = ray["wall_s"] * max(1, gpus) / max(1, ray["candidates"])  # measured, incl. dispatch
    o = max(0.0, per_gpu_eval - g)
    b = r.get("build_task_s") or 0.0
    rows = []
    cpus_measured = os.cpu_count() or 2
    for n in (1, 2, 4, 8):
        row: dict[str, Any] = {"gpus": n}
        for label, c in (("cpus_here", cpus_measured), ("cpus_8_per_gpu", 8 * n)):
            gpu_limit = 60 * n / (g + o)
            build_limit = 60 * c / b if b > 0 else float("inf")
            row[label] = {"cpus": c, "evals_per_min": round(min(gpu_limit, build_limit), 1),
                          "limit": "GPU" if gpu_limit <= build_limit else "builds"}
        rows.append(row)
    r["model_inputs"] = {"g_s": round(g, 3), "o_s": round(o, 3), "b_s": round(b, 3)}
    return rows


def table(r: dict[str, Any]) -> str:
    lines = [f"# Ray throughput ({r['date']}, {r['device']}, {r['gpus']} GPU(s), {r['candidates']} candidates)", "",
             "| executor | wall s | evaluations / min | correct | mean evaluation wall s | build wait s (mean / max) | nodes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for k in ("local", "ray"):
        x = r[k]
        lines.append(f"| {k} | {x['wall_s']} | {x['evals_per_min']} | {x['correct']}/{x['candidates']} | "
                     f"{x['mean_eval_wall_s']} | {x.get('mean_build_wait_s', '-')} / {x.get('max_build_wait_s', '-')} | "
                     f"{', '.join(x['nodes'])} |")
    lines += ["", f"ray / local = {r['ray_vs_local']} (target >= 0.90 on one GPU); "
                  f"connecting and warming the actors took {r['ray_connect_s']} s (once per session).", "",
              f"Model inputs: g = {r['model_inputs']['g_s']} s per evaluation on an actor, o = "
              f"{r['model_inputs']['o_s']} s dispatch, b = {r['model_inputs']['b_s']} s per cold build task"
              + (" (these candidates need no build: the GPUs are the only limit)" if not r['model_inputs']['b_s'] else "")
              + ".", "",
              "| GPUs | evals/min (CPUs here) | limit | evals/min (8 CPUs per GPU) | limit |",
              "| ---: | ---: | --- | ---: | --- |"]
    for row in r["model"]:
        a, b = row["cpus_here"], row["cpus_8_per_gpu"]
        lines.append(f"| {row['gpus']} | {a['evals_per_min']} ({a['cpus']} CPUs) | {a['limit']} | "
                     f"{b['evals_per_min']} | {b['limit']} |")
    if r.get("searches"):
        lines += ["", "Examples' Searches (tuner) through Ray:", "",
                  "| example | start | improved | speedup | evaluated | wall s | ran on |", "| --- | --- | --- | ---: | ---: | ---: | --- |"]
        for x in r["searches"]:
            if "error" in x:
                lines.append(f"| {x['example']} | error: {x['error'][:60]} | | | | | |")
                continue
            sp = f"{x['speedup']:.2f}x" if x.get("speedup") else "-"
            lines.append(f"| {x['example']} | {x['start_verdict']} | {x['improved']} | {sp} | {x['evaluated']} | "
                         f"{x['wall_s']} | {'; '.join(x['ran_on'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--gpus", type=int, default=None, help="GPUs for the cluster (default: what torch sees)")
    ap.add_argument("--quick", action="store_true", help="fewer candidates")
    ap.add_argument("--searches", action="store_true", help="also run the examples' tuner Searches through Ray")
    ap.add_argument("--search-budget", type=int, default=6, metavar="N", help="proposals per example Search")
    ns = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its cluster
    r: dict[str, Any] = {}
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(main_async(ns, r))
    finally:  # what was measured is kept, even from a run stopped part-way
        suffix = "_gpu" if r.get("gpus") else "_cpu"
        r.setdefault("complete", False)
        (out / f"ray_throughput{suffix}.json").write_text(json.dumps(r, indent=2, default=str) + "\n")
    md = table(r)
    (out / f"ray_throughput{suffix}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
