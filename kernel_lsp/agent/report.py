"""An HTML page for one Search: self-contained (inline CSS and SVG, no script, no network).

It shows the result and usage, a plot of the best speedup over evaluations, the tree, and
for each candidate its diff against its parent and its evaluation.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import html
import json
from typing import Any

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


def _tree(node: dict[str, Any], root_ms: float | None) -> str:
    if not node:
        return ""
    items = []
    if node.get("candidate"):
        ev = node.get("evaluation") or {}
        verdict = ev.get("verdict", "not evaluated")
        sp = f" {root_ms / _ms(ev):.2f}x" if root_ms and _ms(ev) and verdict == "correct" else ""
        cls = "ok" if verdict == "correct" else "bad"
        items.append(f'<a href="#c-{_e(node["candidate"])}"><code>{_e(node["candidate"][:10])}</code></a> '
                     f'<span class="badge">{_e(node.get("origin"))}</span> {_e(node.get("note"))} '
                     f'<span class="{cls}">{_e(verdict)}{_e(sp)}</span>')
    kids = "".join(_tree(c, root_ms) for c in node.get("children", []))
    return f"<li>{''.join(items)}{f'<ul class=tree>{kids}</ul>' if kids else ''}</li>"


def _evaluation(ev: dict[str, Any] | None, root_ms: float | None) -> str:
    if not ev:
        return "<p class=muted>Not evaluated.</p>"
    rows = [("verdict", ev.get("verdict")), ("message", ev.get("message")),
            ("flags", ", ".join(ev.get("flags") or []) or "none"),
            ("time", f"{_ms(ev):.4f} ms" if _ms(ev) else None),
            ("spread", f"{ev['time']['spread_pct']:.1f} %" if ev.get("time") else None),
            ("vs start", f"{root_ms / _ms(ev):.3f}x" if root_ms and _ms(ev) else None),
            ("eager", f"{_ms({'time': ev.get('eager')}):.4f} ms" if ev.get("eager") else None),
            ("torch.compile", f"{_ms({'time': ev.get('compiled')}):.4f} ms" if ev.get("compiled") else None),
            ("device", (ev.get("device") or {}).get("name"))]
    out = ["<table>"] + [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows if v not in (None, "")]
    out.append("</table>")
    comp = ev.get("compile") or {}
    if comp.get("log") and not comp.get("ok", True):
        out.append(f"<p>compile log</p><pre>{_e(comp['log'][-4000:])}</pre>")
    if ev.get("evidence"):
        out.append(f"<p>evidence</p><pre>{_e(json.dumps(ev['evidence'], indent=1, default=str)[:4000])}</pre>")
    return "".join(out)


def render_report(store: Any, search_id: int) -> str:
    s = store.search(search_id)
    if s is None:
        raise KeyError(f"no search {search_id}")
    doc = s.get("budget") or {}
    result = doc.get("result") or {}
    usage = doc.get("usage") or {}
    nodes = s.get("nodes") or []
    root = next((n for n in nodes if n.get("parent") is None), None)
    root_ms = _ms(root.get("evaluation") if root else None)
    series = speedup_series(nodes, root_ms)
    improved = result.get("improved")
    sp = result.get("speedup")
    verdict = (f'<span class="ok">improved: {sp:.2f}x faster, verified and confirmed</span>'
               if improved and sp else '<span class="ok">improved (the start did not run correctly)</span>'
               if improved else '<span class="bad">no improvement: the file stays as it is</span>')
    head = [("task", s.get("task")), ("proposer", f"{s.get('proposer')}" + (f" ({doc['model']})" if doc.get("model") else "")),
            ("state", s.get("state")), ("why it stopped", s.get("message")),
            ("started", _when(s.get("started"))), ("finished", _when(s.get("finished"))),
            ("candidates evaluated", result.get("candidates_evaluated", len(nodes))),
            ("proposals", usage.get("proposals")), ("tokens", usage.get("tokens")),
            ("cost", f"${usage.get('cost', 0):.4f}"), ("seconds", usage.get("seconds")),
            ("start time", f"{root_ms:.4f} ms" if root_ms else None)]
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>kernel-lsp search {_e(search_id)}: "
             f"{_e(s.get('task'))}</title><style>{_CSS}</style></head><body>",
             f"<h1>Search {_e(search_id)}: {_e(s.get('task'))}</h1><p>{verdict}</p><table>",
             *[f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in head if v not in (None, "")],
             "</table><h2>Best speedup over evaluations</h2>", _plot(series),
             "<h2>Tree</h2>", f"<ul class=tree>{_tree(s.get('tree') or {}, root_ms)}</ul>"]
    steps = [st for st in doc.get("steps", []) if st.get("failed") and st.get("kind") != "evaluation"]
    if steps:
        parts.append("<h2>Failed steps</h2><table><tr><th>round</th><th>kind</th><th>reason</th></tr>")
        parts += [f"<tr><td>{_e(st.get('round'))}</td><td>{_e(st.get('kind'))}</td><td>{_e(st.get('reason'))}</td></tr>"
                  for st in steps]
        parts.append("</table>")
    parts.append("<h2>Candidates</h2>")
    for n in nodes:
        cand = store.candidate(n["candidate"])
        parent = store.candidate(n["parent"]) if n.get("parent") else None
        ev = n.get("evaluation") or {}
        best = " <span class=ok>(best)</span>" if n["candidate"] == s.get("best") else ""
        parts.append(f'<details id="c-{_e(n["candidate"])}"{" open" if best else ""}><summary><code>'
                     f'{_e(n["candidate"][:10])}</code> <span class="badge">{_e(n.get("origin"))}</span> '
                     f'{_e(n.get("note"))} - <b>{_e(ev.get("verdict", "not evaluated"))}</b>{best}</summary>')
        parts.append(_evaluation(ev, root_ms))
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
