"""Put the inline-build measurements of several runs on the GPU machine into one table (issue 9).

    python benchmarks/inline_build_combine.py FAST_JSON REST_LOG EARLIER_JSON [--out-dir benchmarks/results]

One run of ``benchmarks/inline_build.py`` over all 34 candidates (cold fast builds one at a time,
then default builds, then verdicts) does not fit in one 10-minute call on the lent machine. This
joins, per candidate, the newest measurement of each kind, and says for every number which run
it comes from:

- FAST_JSON: ``inline_build.json`` of a run that built the fast path (``--no-run``), possibly cut
  short by its time budget (candidates marked "not run: time budget spent" are taken from the log);
- REST_LOG: the stderr log of a run over the remaining candidates (``--only``), whose fast and
  default build lines (``fast NAME: S s fast_path=...`` / ``default NAME: S s ...``) are read;
- EARLIER_JSON: an earlier full run's ``inline_build.json`` (same machine kind and torch): the
  default build times and the fast-vs-default verdict and output checks for the candidates it
  covered (the default path, plain ``load_inline``, has not changed since).

Writes ``inline_build.json`` and ``inline_build.md`` in the shape ``inline_build.py`` writes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import inline_build  # noqa: E402

LINE = re.compile(r"^\[inline_build\s+[\d.]+s\]\s+(fast|default)\s+(\S+):\s+(None|[\d.]+) s\s+fast_path=(\w+)\s*(.*)$")


def read_log(path: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        kind, name, secs, fast, why = m.groups()
        row = rows.setdefault(name, {})
        row[f"{kind}_s"] = None if secs == "None" else float(secs)
        if kind == "fast":
            row["fast_path"] = fast == "True"
            row["fallback_reason"] = why.strip()
    return rows


def combine(fast_json: Path, rest_log: Path, earlier_json: Path, rest_command: str = "") -> dict[str, Any]:
    fast = json.loads(fast_json.read_text())
    earlier = {c["name"]: c for c in json.loads(earlier_json.read_text())["candidates"]}
    rest = read_log(rest_log)
    out = []
    for c in fast["candidates"]:
        name = c["name"]
        row: dict[str, Any] = {k: c.get(k) for k in ("name", "origin", "fast_path", "fallback_reason", "fast_s",
                                                     "extensions", "fast_steps", "full_header")}
        row["fast_from"] = "fast run" if c.get("fast_s") is not None or c.get("fallback_reason", "").startswith(
            "fast ") else None
        r = rest.get(name, {})
        if r.get("fast_s") is not None and row["fast_from"] is None:
            row.update(fast_path=r["fast_path"], fallback_reason=r["fallback_reason"], fast_s=r["fast_s"])
            row["fast_from"] = "rest run"
        e = earlier.get(name, {})
        if r.get("default_s") is not None:
            row["default_s"], row["default_from"] = r["default_s"], "rest run"
        elif e.get("default_s") is not None:
            row["default_s"], row["default_from"] = e["default_s"], "earlier run"
        else:
            row["default_s"], row["default_from"] = None, None
        for k in ("same_verdict", "default_verdict", "fast_verdict", "same_output", "output_note"):
            row[k] = e.get(k)
        row["verdict_from"] = "earlier run" if e.get("same_verdict") is not None else None
        out.append(row)
    taken = [r["fast_s"] for r in out if r["fast_path"] and r["fast_s"] is not None]
    defaults = [r["default_s"] for r in out if r["default_s"] is not None]
    pairs = [r["default_s"] / r["fast_s"] for r in out if r["fast_path"] and r["fast_s"] and r["default_s"]]
    checked = [r for r in out if r["same_verdict"] is not None]
    summary = {
        "candidates": len(out), "fast_path": sum(bool(r["fast_path"]) for r in out),
        "fast_share": sum(bool(r["fast_path"]) for r in out) / max(1, len(out)),
        "median_fast_s": statistics.median(taken) if taken else None,
        "median_default_s": statistics.median(defaults) if defaults else None,
        "median_speedup_x": statistics.median(pairs) if pairs else None,
        "verified": len(checked), "verdict_changes": sum(not r["same_verdict"] for r in checked),
        "output_changes": sum(r["same_output"] is False for r in checked),
        "targets": inline_build.TARGETS,
    }
    return {"device": fast["device"], "command": fast["command"], "concurrency": fast["concurrency"],
            "pch": fast.get("pch", {}), "candidates": out, "summary": summary,
            "runs": {"fast run": fast["command"], "rest run": rest_command or f"log {rest_log.name}",
                     "earlier run": json.loads(earlier_json.read_text())["command"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fast_json", type=Path)
    ap.add_argument("rest_log", type=Path)
    ap.add_argument("earlier_json", type=Path)
    ap.add_argument("--rest-command", default="", help="the command of the run REST_LOG comes from")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ns = ap.parse_args(argv)
    res = combine(ns.fast_json, ns.rest_log, ns.earlier_json, ns.rest_command)
    text = inline_build.render(res)
    provenance = ["", "Where each number comes from (the `*_from` fields of the JSON; this file: "
                  f"`python benchmarks/inline_build_combine.py {' '.join(argv or sys.argv[1:])}`):", ""]
    provenance += [f"- {k}: `{v}`" for k, v in res["runs"].items()]
    provenance += ["", "| candidate | fast s from | default s from | verdicts from |", "| --- | --- | --- | --- |"]
    provenance += [f"| {r['name']} | {r['fast_from'] or '-'} | {r['default_from'] or '-'} | {r['verdict_from'] or '-'} |"
                   for r in res["candidates"]]
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    (ns.out_dir / "inline_build.json").write_text(json.dumps(res, indent=1) + "\n")
    (ns.out_dir / "inline_build.md").write_text(text + "\n".join(provenance) + "\n")
    print(text + "\n".join(provenance))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
