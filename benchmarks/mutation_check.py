"""Do the CPU tests catch the engine's defences being removed? Each mutation is a small exact-text
patch applied to a copy of the repository (never to this checkout); the CPU test files that cover
it run against the copy, and at least one test must fail.

    python benchmarks/mutation_check.py [--only NAME] [--out benchmarks/results/mutation_check]

A patch whose text is not found fails the run at once (exit 2), naming the file and the text: the
code moved, and the mutation must be written again, never silently skipped. Exit 1 when a mutation
survives (no test failed), 0 when every one is caught. Writes a table (mutation, tests failed,
failing tests) to <out>.md and <out>.json with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
W = "kernel_lsp/engine/worker/"


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str                               # the defence removed, in words
    patches: tuple[tuple[str, str, str], ...]  # (file, exact text, replacement)
    tests: tuple[str, ...]                  # the CPU test files that must catch it


MUTATIONS = (
    Mutation("poison_fill_cpu", "outputs' memory no longer poisoned on the CPU path (blocks allocated, not filled)",
             ((W + "judge/verify.py", "blocks.append(torch.empty(nbytes, dtype=torch.uint8).fill_(pattern))",
               "blocks.append(torch.empty(nbytes, dtype=torch.uint8))"),),
             ("tests/engine/test_verify.py", "tests/engine/test_cheats_cpu.py")),
    Mutation("nan_fill", "torch.empty & co. no longer filled with NaN while the candidate runs (CPU and GPU)",
             ((W + "judge/verify.py", 'with (SentinelFill() if fill == "sentinel" else nan_fill(bool(fill))):',
               'with (SentinelFill() if fill == "sentinel" else nan_fill(False)):'),),
             ("tests/engine/test_verify.py", "tests/engine/test_cheats_cpu.py")),
    Mutation("mode_check", "training mode never seen as different from eval (the mode probe says 'same')",
             ((W + "judge/modes.py", "res.dependent = bool(res.modules) or not _same(evaluated, first)",
               "res.dependent = False"),),
             ("tests/engine/test_verify.py", "tests/engine/test_cheats_cpu.py", "tests/engine/test_accuracy.py")),
    Mutation("stream_scan", "launches on a stream other than the caller's no longer found in the source",
             (("kernel_lsp/engine/worker/judge/static_checks.py",
               "for offset, stream, what in stream_args.foreign_launches(text, context):",
               "for offset, stream, what in ():"),),
             ("tests/engine/test_side_streams.py", "tests/engine/test_verify.py", "tests/engine/test_cheats_cpu.py")),
    Mutation("float64_oracle", "no float64 oracle: every output judged by the fixed tolerance",
             ((W + "judge/verify.py", "self.oracle = Oracle(h, skip_ops=MOVEMENT_OPS)", "self.oracle = None"),),
             ("tests/engine/test_verify.py", "tests/engine/test_cheats_cpu.py", "tests/engine/test_accuracy.py")),
)


class PatchMissing(Exception):
    pass


def copy_repo(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files (what git would commit), not .venv etc."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():
            continue  # a file deleted in the work tree
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def apply(copy: Path, mutation: Mutation) -> None:
    for rel, old, new in mutation.patches:
        path = copy / rel
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise PatchMissing(f"{mutation.name}: {rel} holds {count} copies of {old!r} (expected exactly 1): "
                               "the code moved; write this mutation again")
        path.write_text(text.replace(old, new))


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    report = copy / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
           f"--junitxml={report}", *tests]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    failed = failing_tests(report)
    return {"rc": proc.returncode, "seconds": round(time.monotonic() - start, 1), "failed": failed,
            "summary": (proc.stdout.strip().splitlines() or [""])[-1],
            "tail": proc.stdout[-2000:] if proc.returncode not in (0, 1) else ""}


def failing_tests(junit: Path) -> list[str]:
    import xml.etree.ElementTree as ET

    if not junit.exists():
        return []
    out = []
    for case in ET.parse(junit).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").replace(".", "/")
            out.append(f"{module}.py::{case.get('name')}")
    return out


def check_imports_this_copy(copy: Path) -> None:
    """The tests must import the mutated copy, not an installed kernel_lsp."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    where = subprocess.run([sys.executable, "-c", "import kernel_lsp; print(kernel_lsp.__file__)"], cwd=copy,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"mutation_check: the copy's tests import {where}, not the copy: "
                         "uninstall the non-editable kernel_lsp or run from a checkout")


def table(rows: list[dict]) -> str:
    lines = ["| mutation | removed | tests run | failed | failing tests |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        names = "<br>".join(f"`{t}`" for t in r["failed"]) or "**none: survived**"
        lines.append(f"| {r['name']} | {r['what']} | {', '.join(Path(t).name for t in r['tests'])} | "
                     f"{len(r['failed'])} | {names} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="run only this mutation (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mutation_check"),
                    help="results path without extension ('' to write none)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per mutation's test run")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if not chosen:
        print(f"mutation_check: no mutation named {args.only}; known: {[m.name for m in MUTATIONS]}",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-mutation-") as tmp:
        # First the unmutated copy: a test that fails anyway would be counted as a catch.
        files = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        clean = Path(tmp) / "unmutated"
        copy_repo(clean)
        check_imports_this_copy(clean)
        base = run_tests(clean, files, args.timeout)
        if base["rc"] != 0:
            print(f"mutation_check: the tests fail without any mutation ({base['summary']}): "
                  f"{', '.join(base['failed']) or base['tail']}", file=sys.stderr)
            return 2
        print(f"unmutated: {base['summary']} ({base['seconds']} s)", flush=True)
        shutil.rmtree(clean, ignore_errors=True)
        for m in chosen:
            copy = Path(tmp) / m.name
            copy_repo(copy)
            try:
                apply(copy, m)
            except PatchMissing as exc:
                print(f"mutation_check: {exc}", file=sys.stderr)
                return 2
            check_imports_this_copy(copy)
            res = run_tests(copy, m.tests, args.timeout)
            if res["rc"] not in (0, 1):  # 2-5: the tests could not run at all, not a catch
                print(f"mutation_check: {m.name}: pytest exit {res['rc']}, not a test failure:\n{res['tail']}",
                      file=sys.stderr)
                return 2
            rows.append({"name": m.name, "what": m.what, "tests": list(m.tests), **res})
            print(f"{m.name}: {len(res['failed'])} failed ({res['summary']}, {res['seconds']} s)", flush=True)
            shutil.rmtree(copy, ignore_errors=True)
    text = table(rows)
    print(text)
    survived = [r["name"] for r in rows if not r["failed"]]
    if args.out:
        command = "python benchmarks/mutation_check.py" + "".join(f" --only {n}" for n in args.only or [])
        meta = {"command": command, "unmutated": base["summary"], "python": sys.version.split()[0],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "survived": survived, "rows": rows}
        Path(args.out + ".json").write_text(json.dumps(meta, indent=1) + "\n")
        Path(args.out + ".md").write_text(
            "# Mutation check: each defence removed in turn, and the CPU tests that catch it\n\n"
            f"`{command}` ({meta['date']}, Python {meta['python']}, CPU only). Each mutation is an exact-text "
            "patch on a copy of the repository; the named test files run against the copy. Unmutated, the "
            f"same files: {meta['unmutated']}.\n\n" + text + "\n")
    if survived:
        print(f"mutation_check: not caught by any test: {', '.join(survived)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
