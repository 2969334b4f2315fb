"""An HTML page for one Search: self-contained (inline CSS and SVG, no script, no network).

It shows the result and usage, a plot of the best speedup over evaluations, the tree, and
for each candidate its diff against its parent and its evaluation: only this Search's own
measurements (a later Search's re-timing of the same candidate is not mixed in), each
speedup with its spread and against both baselines, PyTorch rewrites labelled as such.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import html
import json
from typing import Any

from kernel_lsp import verdicts
from kernel_lsp.agent.seed import summary_line

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:.2em .6em;border-bottom:1px solid #eee;text-align:left}
.ok{color:#17803d}.bad{color:#b42318}.muted{color:#777}
pre{background:#f6f8fa;padding:.6em;overflow:auto;font-size:12px;max-height:40em}
.add{background:#e6ffec;display:block}.del{background:#ffebe9;display:block}.hunk{color:#6639ba;display:block}
ul.tree{list-style:none;padding-left:1.2em;border-left:1px dotted #ccc}
details{margin:.4em 0;border:1px solid #eee;border-radius:4px;padding:.3em .6em}
summary{cursor:pointer}.badge{font-size:11px;padding:0 .4em;border-radius:3px;background:#eee}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _ms(ev: dict[str, Any] | None) -> float | None:
    t = (ev or {}).get("time")
    return t.get("median_ms") if isinstance(t, dict) else None


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _diff(old: str, new: str, a: str, b: str) -> str:
    lines = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), a, b, lineterm="", n=3):
        cls = ("add" if line.startswith("+") and not line.startswith("+++") else
               "del" if line.startswith("-") and not line.startswith("---") else
               "hunk" if line.startswith("@@") else "")
        lines.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return "\n".join(lines) or "(no change)"


def speedup_series(nodes: list[dict[str, Any]], root_ms: float | None) -> list[tuple[int, float | None, float]]:
    """(evaluation index, this candidate's speedup or None, best so far) in step order."""
    out: list[tuple[int, float | None, float]] = []
    best = 1.0
    for i, n in enumerate(nodes):
        ev = n.get("evaluation")
        s = None
        if ev and ev.get("verdict") == "correct" and root_ms and _ms(ev):
            s = root_ms / _ms(ev)  # type: ignore[operator]
            if "not_counted" not in (ev.get("flags") or []) and n.get("parent") is not None:
                best = max(best, s)
        out.append((i, s, best))
    return out


def _plot(series: list[tuple[int, float | None, float]], w: int = 640, h: int = 220) -> str:
    if not series:
        return "<p class=muted>No evaluations.</p>"
    pad = 36
    ys = [s for _, s, _ in series if s is not None] + [b for *_, b in series] + [1.0]
    ymax = max(ys) * 1.1
    n = max(1, len(series) - 1)

    def x(i: int) -> float:
        return pad + (w - 2 * pad) * i / n

    def y(v: float) -> float:
        return h - pad - (h - 2 * pad) * v / ymax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
             f'aria-label="best speedup over evaluations">',
             f'<line x1="{pad}" y1="{y(1):.1f}" x2="{w - pad}" y2="{y(1):.1f}" stroke="#bbb" stroke-dasharray="4"/>',
             f'<text x="4" y="{y(1) + 4:.1f}" font-size="10" fill="#777">1.0x</text>',
             f'<text x="4" y="{y(ymax / 1.1) + 4:.1f}" font-size="10" fill="#777">{ymax / 1.1:.2f}x</text>',
             f'<text x="{w / 2:.0f}" y="{h - 6}" font-size="11" fill="#555" text-anchor="middle">evaluation</text>']
    pts = " ".join(f"{x(i):.1f},{y(b):.1f}" for i, _, b in series)
    parts.append(f'<polyline fill="none" stroke="#17803d" stroke-width="2" points="{pts}"/>')
    for i, s, _ in series:
        if s is None:
            parts.append(f'<text x="{x(i):.1f}" y="{h - pad + 12}" font-size="10" fill="#b42318" '
                         f'text-anchor="middle">x</text>')
        else:
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(s):.1f}" r="3" fill="#2563eb"><title>{s:.3f}x</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


_REWRITE = "PyTorch rewrite (no custom kernel)"
_CHEAT_FLAGS = frozenset({"timer_patch", "tampering", "side_stream", "thread_started", "result_cache",
                          "result_cache_suspected", "precision_lowering", "cuda_graph", "beyond_roofline"})
_SPREAD_WARN = 10.0  # percent: above it a number is a warning, not a fact


def _spread(*evs_or_timings: dict[str, Any] | None) -> float | None:
    vals = []
    for t in evs_or_timings:
        if isinstance(t, dict) and isinstance(t.get("spread_pct"), (int, float)):
            vals.append(float(t["spread_pct"]))
    return max(vals) if vals else None


def _x(x: float | None, spread: float | None) -> str:
    if x is None:
        return ""
    if spread is None:
        return f"{x:.2f}x"
    if spread > _SPREAD_WARN:
        return f"~{x:.2f}x (spread {spread:.0f}%: not reliable)"
    return f"{x:.2f}x \u00b1{spread:.1f}%"


def _is_rewrite(ev: dict[str, Any], kind: str | None, source: str | None) -> bool:
    if ev.get("custom_kernel") is not None:
        return not ev["custom_kernel"]
    if "torch_fallback" in (ev.get("flags") or []):
        return True
    if kind == "cuda" or source is None:
        return False
    markers = ("load_inline", "cpp_extension", "__global__", "triton.jit", "ctypes.CDLL", "cuda.jit")
    return not any(m in source for m in markers)


class _View:
    """One Search's own measurements, per candidate: the first run, and the confirmation
    re-run when there was one; the Search's verdict on each (counted or not, and why)."""

    def __init__(self, store: Any, s: dict[str, Any]) -> None:
        nodes = s.get("nodes") or []
        fn = getattr(store, "search_evaluations", None)
        own = fn(s["id"]) if fn is not None else {}
        self.runs: dict[str, list[dict[str, Any]]] = {
            n["candidate"]: own.get(n["candidate"]) or ([n["evaluation"]] if fn is None and n.get("evaluation") else [])
            for n in nodes}
        steps = (s.get("budget") or {}).get("steps", [])
        self.counted = {st.get("candidate"): not st.get("failed") for st in steps if st.get("kind") == "evaluation"}
        self.confirmed = {st.get("candidate"): st for st in steps if st.get("kind") == "confirmation"}
        root = next((n for n in nodes if n.get("parent") is None), None)
        self.root_id = root["candidate"] if root else None
        self.root_first = self.first(self.root_id) if root else None
        self.root_ms = _ms(self.root_first)

    def first(self, cand: str | None) -> dict[str, Any] | None:
        runs = self.runs.get(cand or "") or []
        return runs[0] if runs else None

    def last(self, cand: str | None) -> dict[str, Any] | None:
        runs = self.runs.get(cand or "") or []
        return runs[-1] if len(runs) > 1 else None

    def speedup(self, cand: str) -> tuple[float | None, float | None]:
        """First-run speedup over the start's first run, and its spread."""
        ev = self.first(cand)
        if not ev or ev.get("verdict") != "correct" or not self.root_ms or not _ms(ev):
            return None, None
        return self.root_ms / _ms(ev), _spread(ev.get("time"), (self.root_first or {}).get("time"))

    def not_counted(self, cand: str) -> str | None:
        """Why a correct candidate did not count for this Search (its flags), or None."""
        ev = self.first(cand) or {}
        if ev.get("verdict") != "correct" or cand == self.root_id or self.counted.get(cand, True):
            return None
        flags = [f for f in ev.get("flags") or [] if f != "not_counted"]
        return "not counted" + (f" ({', '.join(flags)})" if flags else "")


def _tree(node: dict[str, Any], view: _View, best: str | None, kinds: dict[str, tuple[str, str]]) -> str:
    if not node:
        return ""
    items = []
    cand = node.get("candidate")
    if cand:
        ev = view.first(cand) or {}
        verdict = ev.get("verdict", "not evaluated")
        sp, spread = view.speedup(cand)
        why_not = view.not_counted(cand)
        is_best = cand == best
        cls = "ok" if verdict == "correct" and not why_not and (is_best or cand == view.root_id or (sp or 0) > 1) \
            else "muted" if verdict == "correct" else "bad"
        text = verdict + (f" {_x(sp, spread)} (first run)" if sp is not None and cand != view.root_id else "")
        if why_not:
            text += f"; {why_not}"
        kind, source = kinds.get(cand, ("", ""))
        label = f' <span class="badge">{_e(_REWRITE)}</span>' if verdict == "correct" and _is_rewrite(
            ev, kind, source) and cand != view.root_id else ""
        start = ' <span class="badge">start</span>' if cand == view.root_id else ""
        star = " <b>(best)</b>" if is_best else ""
        items.append(f'<a href="#c-{_e(cand)}"><code>{_e(cand[:10])}</code></a> '
                     f'<span class="badge">{_e(node.get("origin"))}</span>{start}{label} {_e(node.get("note"))} '
                     f'<span class="{cls}">{_e(text)}</span>{star}')
    kids = "".join(_tree(c, view, best, kinds) for c in node.get("children", []))
    return f"<li>{''.join(items)}{f'<ul class=tree>{kids}</ul>' if kids else ''}</li>"


def _shared(shared: dict[str, Any] | None) -> str | None:
    if not shared:
        return None
    n = shared.get("count") or len(shared.get("processes") or []) or 1
    return f"timed while {n} other process{'es' if n != 1 else ''} used the GPU"


def _evaluation(ev: dict[str, Any] | None, view: _View, cand: str, again: dict[str, Any] | None) -> str:
    if not ev:
        return "<p class=muted>Not evaluated in this Search.</p>"
    sp, spread = view.speedup(cand)
    base = view.root_first or {}
    eager, compiled = base.get("eager"), base.get("compiled")
    t = ev.get("time")
    rows = [("verdict", ev.get("verdict")), ("message", ev.get("message")),
            ("flags", ", ".join(ev.get("flags") or []) or "none"),
            ("accuracy", verdicts.accuracy_phrase(ev.get("accuracy"))),
            ("speed of light", (verdicts.speed_of_light(ev) or {}).get("label")),
            ("algebraic shortcut", verdicts.shortcut_phrase(ev)),
            ("time (first run)", f"{_ms(ev):.4f} ms" if _ms(ev) else None),
            ("spread", f"{t['spread_pct']:.1f} %" if isinstance(t, dict) else None),
            ("vs start (first run)", _x(sp, spread) if cand != view.root_id else None),
            ("vs PyTorch eager", _x(_ms({"time": eager}) / _ms(ev), _spread(t, eager))
             if _ms(ev) and _ms({"time": eager}) else None),
            ("vs torch.compile", _x(_ms({"time": compiled}) / _ms(ev), _spread(t, compiled))
             if _ms(ev) and _ms({"time": compiled}) else None),
            ("eager", f"{_ms({'time': eager}):.4f} ms" if eager else None),
            ("torch.compile", f"{_ms({'time': compiled}):.4f} ms" if compiled else None),
            ("device", (ev.get("device") or {}).get("name")),
            ("shared GPU", _shared(ev.get("shared_gpu"))),
            ("sandbox", None if ev.get("sandboxed") is None
             else "ran sandboxed" if ev.get("sandboxed") else "ran without a sandbox"),
            ("ran on", f"{ev.get('executor')} {ev.get('node')}" if ev.get("node") else None)]
    if again is not None and _ms(again):
        rows.insert(4, ("time (confirmation re-run)", f"{_ms(again):.4f} ms"
                        f" (spread {(again.get('time') or {}).get('spread_pct', 0):.1f} %)"))
    out = ["<table>"] + [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows if v not in (None, "")]
    out.append("</table>")
    comp = ev.get("compile") or {}
    if comp.get("log") and not comp.get("ok", True):
        out.append(f"<p>compile log</p><pre>{_e(comp['log'][-4000:])}</pre>")
    if ev.get("evidence"):
        out.append(f"<p>evidence</p><pre>{_e(json.dumps(ev['evidence'], indent=1, default=str)[:4000])}</pre>")
    return "".join(out)


def _headline(result: dict[str, Any], s: dict[str, Any], view: _View, kinds: dict[str, tuple[str, str]]) -> str:
    """The verdict at the top, in agreement with the tree below it."""
    improved, sp, best = result.get("improved"), result.get("speedup"), result.get("best")
    reason = result.get("reason") or s.get("message") or ""
    if improved:
        best_first = view.first(best) or {}
        best_again = view.last(best) or best_first
        start_again = view.last(view.root_id) or view.root_first or {}
        spread = _spread(best_again.get("time"), start_again.get("time"))
        how = "confirmed by a re-run against the start" if result.get("confirmed") else "first run"
        kind, source = kinds.get(best or "", ("", ""))
        label = _REWRITE if _is_rewrite(best_first, kind, source) else "custom kernel"
        parts = [f'<span class="ok">improved: {_e(_x(sp, spread))} faster than the start ({_e(how)}), '
                 f'{_e(label)}</span>' if sp else '<span class="ok">improved (the start did not run correctly)</span>']
        base = view.root_first or {}
        t = best_again.get("time")
        for name, key in (("PyTorch eager", "eager"), ("torch.compile", "compiled")):
            b = base.get(key)
            if _ms({"time": b}) and _ms(best_again):
                ratio = _ms({"time": b}) / _ms(best_again)
                parts.append(f"vs {name}: {_e(_x(ratio, _spread(t, b)))}")
                if key == "compiled" and ratio < 1:
                    parts.append('<span class="bad">torch.compile of the reference is faster than this '
                                 'candidate: consider torch.compile instead</span>')
        if spread is not None and spread > _SPREAD_WARN:
            parts.append(f'<span class="bad">warning: the timing spread is {spread:.1f}%: not reliable</span>')
        return "<br>".join(parts)
    outcome = result.get("outcome")
    if outcome == "cannot_run" or (outcome is None and (view.root_first or {}).get("verdict") == "not_run"):
        return f'<span class="bad">could not run: {_e(reason)}; the file stays as it is</span>'
    if outcome == "cancelled":
        return '<span class="bad">cancelled; the file stays as it is</span>'
    looked = [n for n in view.runs if n != view.root_id and (view.speedup(n)[0] or 0) > 1]
    what = "the Search failed" if outcome == "failed" else "no improvement"
    text = f'<span class="bad">{what}: {_e(reason)}; the file stays as it is</span>'
    if looked:
        flagged = [n for n in looked if view.not_counted(n)]
        text += (f"<br>{len(looked)} candidate{'s' if len(looked) != 1 else ''} looked faster in a first run: "
                 f"{len(flagged)} did not count (see their flags), "
                 f"{len(looked) - len(flagged)} did not stay faster when re-timed against the start")
    return text


def render_report(store: Any, search_id: int) -> str:
    s = store.search(search_id)
    if s is None:
        raise KeyError(f"no search {search_id}")
    doc = s.get("budget") or {}
    result = doc.get("result") or {}
    usage = doc.get("usage") or {}
    nodes = s.get("nodes") or []
    view = _View(store, s)
    cands = {n["candidate"]: store.candidate(n["candidate"]) for n in nodes}
    kinds = {k: (c.kind, c.source) if c is not None else ("", "") for k, c in cands.items()}
    series = speedup_series([{**n, "evaluation": view.first(n["candidate"])} for n in nodes], view.root_ms)
    best = result.get("best") if result.get("improved") else None
    base = view.root_first or {}
    head = [("task", s.get("task")), ("proposer", f"{s.get('proposer')}" + (f" ({doc['model']})" if doc.get("model") else "")),
            ("state", s.get("state")), ("why it stopped", s.get("message")),
            ("started", _when(s.get("started"))), ("finished", _when(s.get("finished"))),
            ("candidates evaluated", result.get("candidates_evaluated", len(nodes))),
            ("proposals", usage.get("proposals")), ("tokens", usage.get("tokens")),
            ("cost", f"${usage.get('cost', 0):.4f}"), ("seconds", usage.get("seconds")),
            ("start time", f"{view.root_ms:.4f} ms" if view.root_ms else None),
            ("PyTorch eager", f"{_ms({'time': base.get('eager')}):.4f} ms" if base.get("eager") else None),
            ("torch.compile", f"{_ms({'time': base.get('compiled')}):.4f} ms" if base.get("compiled") else None),
            ("device", (base.get("device") or {}).get("name")),
            ("torch.compile seed", summary_line(result.get("seed")))]
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>kernel-lsp search {_e(search_id)}: "
             f"{_e(s.get('task'))}</title><style>{_CSS}</style></head><body>",
             f"<h1>Search {_e(search_id)}: {_e(s.get('task'))}</h1><p>{_headline(result, s, view, kinds)}</p><table>",
             *[f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in head if v not in (None, "")],
             "</table><p class=muted>Every number on this page is this Search's own measurement: a "
             "candidate's first run, and its confirmation re-run where there was one.</p>"
             "<h2>Best speedup over evaluations (first runs)</h2>", _plot(series),
             "<h2>Tree</h2>", f"<ul class=tree>{_tree(s.get('tree') or {}, view, best, kinds)}</ul>"]
    steps = [st for st in doc.get("steps", []) if st.get("failed") and st.get("kind") != "evaluation"]
    if steps:
        parts.append("<h2>Failed steps</h2><table><tr><th>round</th><th>kind</th><th>reason</th></tr>")
        parts += [f"<tr><td>{_e(st.get('round'))}</td><td>{_e(st.get('kind'))}</td><td>{_e(st.get('reason'))}</td></tr>"
                  for st in steps]
        parts.append("</table>")
    parts.append("<h2>Candidates</h2>")
    for n in nodes:
        cand = cands.get(n["candidate"])
        parent = store.candidate(n["parent"]) if n.get("parent") else None
        ev = view.first(n["candidate"]) or {}
        mark = " <span class=ok>(best)</span>" if n["candidate"] == best else ""
        parts.append(f'<details id="c-{_e(n["candidate"])}"{" open" if mark else ""}><summary><code>'
                     f'{_e(n["candidate"][:10])}</code> <span class="badge">{_e(n.get("origin"))}</span> '
                     f'{_e(n.get("note"))} - <b>{_e(ev.get("verdict", "not evaluated"))}</b>{mark}</summary>')
        parts.append(_evaluation(ev, view, n["candidate"], view.last(n["candidate"])))
        if cand is not None and parent is not None:
            parts.append(f"<p>diff against its parent <code>{_e(parent.id[:10])}</code></p>"
                         f"<pre>{_diff(parent.source, cand.source, parent.id[:10], cand.id[:10])}</pre>")
        elif cand is not None:
            parts.append(f"<p>source (the start)</p><pre>{_e(cand.source)}</pre>")
        parts.append("</details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(store: Any, search_id: int, path: str) -> str:
    """Render one Search and write it to `path` (directories made); returns the path."""
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    page = render_report(store, search_id)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path
