"""How many load_inline calls of published KernelBench solutions bind main.cpp by signature
(kernel_lsp/engine/worker/build/binding.py), in how many distinct texts, how many the
signatures built ahead (binding.COMMON) serve, and how many the table binding's one main.cpp
serves (table_binding.py: on x86-64 Linux, where builds use it first). No GPU, no compiler: the calls' arguments are read
from each file's syntax tree (literals and module-level names bound to literals; the rest counted
as unresolved).

  python benchmarks/binding_coverage.py DIR_OR_CLONE [...]
      a folder of .py files, or a clone of anneouyang/KernelBenchLeaderboard (its
      docs/assets/solutions/ are read from git: the folder holds them as files without a suffix)

Prints a table and writes benchmarks/results/binding_coverage.{json,md} (--out-dir elsewhere).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.engine.worker.build import binding, table_binding  # noqa: E402  (no torch needed)
from benchmarks.results_out import write_results  # noqa: E402


def sources(where: Path) -> list[tuple[str, str]]:
    """(name, text) of every solution under ``where``."""
    if (where / ".git").exists() or (where / "HEAD").exists():
        git = ["git", "-C", str(where)] if (where / ".git").exists() else ["git", "--git-dir", str(where)]
        names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", "docs/assets/solutions"],
                               capture_output=True, text=True, check=True).stdout.split()
        return [(n, subprocess.run([*git, "show", f"HEAD:{n}"], capture_output=True, text=True).stdout) for n in names]
    return [(str(p), p.read_text(errors="replace")) for p in sorted(where.rglob("*.py"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("where", nargs="+")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()
    texts: collections.Counter[str] = collections.Counter()
    signature: dict[str, str] = {}
    kept: collections.Counter[str] = collections.Counter()
    by_table: dict[str, str] = {}  # text: "" when the table binding serves it, else why not
    files = resolved = unresolved = 0
    for where in a.where:
        for _, text in sources(Path(where)):
            files += 1
            for kw in binding.literal_calls(text):
                if kw is None:
                    unresolved += 1
                    continue
                resolved += 1
                b, why = binding.of(kw)
                if b is None:
                    kept[why] += 1
                    continue
                texts[b.text()] += 1
                by_table[b.text()] = table_binding.codes_of(b)[1]
                signature[b.text()] = " ; ".join(f"{r}({', '.join(p)})" for _, _, r, p in b.functions)
    ahead = [b.text() for b in binding.common(len(binding.COMMON))]
    served = sum(texts[t] for t in ahead)
    bound = sum(texts.values())
    tabled = sum(c for t, c in texts.items() if not by_table[t])
    doc = {"where": a.where, "files": files, "calls": resolved, "unresolved": unresolved, "bound": bound,
           "distinct": len(texts), "served_ahead": served, "ahead": len(ahead), "by_table": tabled, "kept_text": dict(kept),
           "signatures": [{"signature": signature[t], "calls": c, "ahead": t in ahead, "table": by_table[t] or "yes"}
                          for t, c in texts.most_common()]}
    lines = ["# main.cpp bound by signature: published KernelBench solutions", "",
             f"`python benchmarks/binding_coverage.py {' '.join(a.where)}`", "",
             f"{files} files, {resolved + unresolved} load_inline calls ({unresolved} with arguments that are not "
             f"literals, not counted). Of {resolved}: **{bound} bound by signature** in {len(texts)} distinct texts, "
             f"{resolved - bound} kept load_inline's text; the {len(ahead)} signatures built ahead serve "
             f"**{served}** ({100 * served / max(1, resolved):.0f} %). The table binding's one main.cpp serves "
             f"**{tabled}** ({100 * tabled / max(1, resolved):.1f} %).", "",
             "| calls | signature | built ahead | by table |", "| ---: | --- | --- | --- |"]
    lines += [f"| {s['calls']} | `{s['signature']}` | {'yes' if s['ahead'] else ''} | {s['table']} |"
              for s in doc["signatures"]]
    if kept:
        lines += ["", "Kept load_inline's text:", ""] + [f"- {c}: {w}" for w, c in kept.most_common()]
    write_results(a.out_dir, "binding_coverage", doc, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
