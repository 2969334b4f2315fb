"""Gather the KernelBench-format candidates that ``benchmarks/inline_build.py`` builds (issue 9).

    python benchmarks/gather_inline_corpus.py [--repo-dir DIR] [--out benchmarks/corpus/inline_build]
    python benchmarks/gather_inline_corpus.py --select N --repo-dir DIR   # rewrite the manifest

The candidates are published KernelBench solutions written by LLMs for the KernelBench leaderboard
(github.com/anneouyang/KernelBenchLeaderboard, ``docs/assets/solutions/*.py``), each with its
KernelBench problem file (``docs/assets/problems/l<level>_p<id>.py``: ``Model``, ``get_inputs``,
``get_init_inputs``). The leaderboard's ``raw_data.json`` counts ``problem_id`` from 0 and the
problem files from 1: solution ``problem_id`` N solves ``l<level>_p<N+1>.py`` (the softmax
solutions listed as problem 22 next to ``l1_p22.py``, a Tanh, and ``l1_p23.py``, a Softmax; the
level-2 solutions' ``ModelNew`` takes the init arguments of problem N+1). Names use the file's
number. ``pairing_problems`` checks each pair before it is kept. Nothing of them is committed here: ``benchmarks/inline_build_manifest.json``
keeps repo, path, commit and sha256 of every file, and this script copies them into the git-ignored
folder ``--out`` as ``<name>/model_new.py`` and ``<name>/reference.py``, checking each sha256.

Without ``--repo-dir`` it clones the repository (needs network and git). ``--select N`` picks N
solutions again: every one that uses AT_DISPATCH, a template, shared memory or several kernels
(levels 1 and 2), then plain ones, in a fixed order.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "benchmarks" / "inline_build_manifest.json"
DEFAULT_OUT = ROOT / "benchmarks" / "corpus" / "inline_build"
REPO = "anneouyang/KernelBenchLeaderboard"
COMMIT = "170ca7965f53bba599d1078b6fcaa5dd2658ec50"


def git_show(repo_dir: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo_dir), "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tags_of(code: str) -> list[str]:
    tags = []
    if "AT_DISPATCH" in code:
        tags.append("at_dispatch")
    if re.search(r"template\s*<", code):
        tags.append("template")
    if "extern __shared__" in code:
        tags.append("extern_shared")
    elif "__shared__" in code:
        tags.append("shared")
    if len(re.findall(r"__global__", code)) > 1:
        tags.append("several_kernels")
    return tags


def problem_file(level: int, problem_id: int) -> str:
    """The KernelBench problem file a leaderboard solution was written for (problem_id from 0)."""
    return f"docs/assets/problems/l{level}_p{problem_id + 1}.py"


def _init_params(code: str, cls: str) -> tuple[int, int] | None:
    """(required, total) positional parameters of ``cls.__init__`` besides self; None if absent."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args.posonlyargs + item.args.args
                    total = len(args) - 1
                    return total - len(item.args.defaults), (10**6 if item.args.vararg else total)
            return 0, 0
    return None


def _returned_list_len(code: str, fn: str) -> int | None:
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Return) and isinstance(stmt.value, (ast.List, ast.Tuple)):
                    return len(stmt.value.elts)
    return None


def pairing_problems(solution: str, problem: str) -> str:
    """Why a solution does not fit a problem file ("" when it fits as far as can be seen without
    running it): ModelNew(*get_init_inputs()) must bind, and the problem must define the contract."""
    try:
        params = _init_params(solution, "ModelNew")
        n_init = _returned_list_len(problem, "get_init_inputs")
    except SyntaxError as exc:
        return f"does not parse: {exc}"
    if params is None:
        return "the solution has no ModelNew"
    if _init_params(problem, "Model") is None or _returned_list_len(problem, "get_inputs") is None:
        return "the problem file has no Model or get_inputs"
    if n_init is not None and not params[0] <= n_init <= params[1]:
        return f"ModelNew takes {params[0]}..{params[1]} init arguments, get_init_inputs gives {n_init}"
    return ""


def select(repo_dir: Path, count: int) -> dict:
    raw = json.loads(git_show(repo_dir, COMMIT, "docs/assets/raw_data.json"))
    rows = []
    for r in raw:
        code = r["code"]
        if "load_inline" not in code or "cuda_sources" not in code or r["level"] not in (1, 2):
            continue
        rows.append((not tags_of(code), r["file"], r))
    rows.sort(key=lambda x: (x[0], x[1]))
    entries = []
    for _, _, r in rows:
        if len(entries) == count:
            break
        path = f"docs/assets/solutions/{r['file']}.py"
        ref = problem_file(r["level"], r["problem_id"])
        why = pairing_problems(r["code"], git_show(repo_dir, COMMIT, ref).decode())
        if why:
            print(f"left out {path}: it does not fit {ref}: {why}", file=sys.stderr)
            continue
        entries.append({
            "name": re.sub(r"[^A-Za-z0-9_.-]", "_", f"l{r['level']}_p{r['problem_id'] + 1}_{r['model']}_{r['file'][:6]}"),
            "repo": REPO, "commit": COMMIT, "path": path, "sha256": sha256(git_show(repo_dir, COMMIT, path)),
            "reference": {"repo": REPO, "commit": COMMIT, "path": ref, "sha256": sha256(git_show(repo_dir, COMMIT, ref))},
            "author": r.get("display_name") or r.get("model"), "tags": tags_of(r["code"]),
        })
    return {"source": f"https://github.com/{REPO}", "note": "LLM-written KernelBench solutions from the KernelBench "
            "leaderboard, with their KernelBench problem files; gathered by benchmarks/gather_inline_corpus.py",
            "candidates": entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo-dir", type=Path, help=f"a clone of {REPO} (default: clone it)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--select", type=int, default=0, help="pick this many candidates and rewrite the manifest")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo_dir = args.repo_dir
        if repo_dir is None:
            repo_dir = Path(tmp) / "repo"
            try:
                subprocess.run(["git", "clone", "--quiet", f"https://github.com/{REPO}", str(repo_dir)], check=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                print(f"cannot clone {REPO}: {exc}", file=sys.stderr)
                return 2
        if args.select:
            MANIFEST.write_text(json.dumps(select(repo_dir, args.select), indent=1) + "\n")
            print(f"wrote {MANIFEST}")
        manifest = json.loads(MANIFEST.read_text())
        bad = 0
        for e in manifest["candidates"]:
            d = args.out / e["name"]
            d.mkdir(parents=True, exist_ok=True)
            for rec, fname in ((e, "model_new.py"), (e["reference"], "reference.py")):
                data = git_show(repo_dir, rec["commit"], rec["path"])
                if sha256(data) != rec["sha256"]:
                    print(f"{e['name']}: {rec['path']} has changed (sha256)", file=sys.stderr)
                    bad += 1
                    continue
                (d / fname).write_bytes(data)
            if (d / "model_new.py").exists() and (d / "reference.py").exists():
                why = pairing_problems((d / "model_new.py").read_text(), (d / "reference.py").read_text())
                if why:
                    print(f"{e['name']}: the solution does not fit its problem file: {why}", file=sys.stderr)
                    bad += 1
            (d / "origin.json").write_text(json.dumps(e, indent=1))
        print(f"{len(manifest['candidates']) - bad} candidates in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
