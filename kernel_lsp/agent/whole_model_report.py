"""The HTML page of a whole-model run (`kernel-lsp report ID` for a run stored by
agent/whole_model.py): the ops by share, each op's Search (every candidate with its verdict
and time), and the end-to-end result with both baselines. Self-contained, no scripts."""

from __future__ import annotations

import html
from typing import Any

from .whole_model import PROPOSER_NAME

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.bar{background:#4a7bd0;height:10px;display:inline-block}
.ok{color:#17703a}.bad{color:#b3261e}.muted{color:#777}pre{background:#f7f7f7;padding:8px;overflow:auto}
"""


def is_whole_model(row: dict[str, Any] | None) -> bool:
    return bool(row) and row.get("proposer") == PROPOSER_NAME  # type: ignore[union-attr]


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "-"


def _ms(v: Any) -> str:
    return f"{v:.4g} ms" if isinstance(v, (int, float)) else "-"


def _search_table(store: Any, search_id: int | None) -> str:
    if search_id is None:
        return "<p class=muted>no Search (the op was not extracted)</p>"
    row = store.search(int(search_id))
    if row is None:
        return f"<p class=muted>Search {search_id} is not in this store</p>"
    root = next((n for n in row["nodes"] if n["parent"] is None), None)
    start_ms = ((root or {}).get("evaluation") or {}).get("time", {}) or {}
    start = start_ms.get("median_ms") if isinstance(start_ms, dict) else None
    out = [f"<p>Search {row['id']}: {html.escape(row['state'])}; {html.escape(row['message'] or '')}</p>",
           "<table><tr><th>#</th><th>candidate</th><th>origin</th><th>note</th><th>verdict</th>"
           "<th>time</th><th>vs start</th><th>flags</th></tr>"]
    for i, n in enumerate(row["nodes"]):
        ev = n.get("evaluation") or {}
        t = (ev.get("time") or {}).get("median_ms") if isinstance(ev.get("time"), dict) else None
        vs = start / t if start and t else None
        verdict = ev.get("verdict", "-")
        cls = "ok" if verdict == "correct" else "bad"
        best = " <b>(winner)</b>" if row.get("best") == n["candidate"] else ""
        out.append(f"<tr><td>{i}</td><td><code>{n['candidate'][:10]}</code>{best}</td>"
                   f"<td>{html.escape(n['origin'])}</td><td>{html.escape((n['note'] or '')[:80])}</td>"
                   f"<td class={cls}>{html.escape(verdict)}</td><td>{_ms(t)}</td><td>{_x(vs)}</td>"
                   f"<td>{html.escape(', '.join(ev.get('flags') or []))}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def render_whole_model(store: Any, record_id: int) -> str:
    """The page for one whole-model run; KeyError when the record does not exist or is not one."""
    row = store.search(int(record_id))
    if not is_whole_model(row):
        raise KeyError(record_id)
    assert row is not None
    doc = (row.get("budget") or {}).get("whole_model") or {}
    name = html.escape(str(doc.get("model", row["task"])))
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>kernel-lsp: whole model {name}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Whole model: {name}</h1>",
             f"<p>forward {_ms(doc.get('total_ms'))} ({html.escape(str(doc.get('time')))} time) on "
             f"{html.escape(str(doc.get('device')))}; {html.escape(str(doc.get('reason', '')))}</p>"]
    e = doc.get("end_to_end")
    parts.append("<h2>End to end</h2>")
    if e:
        verdict = "correct" if e.get("correct") else f"not counted ({e.get('verdict')}" + (
            f": {', '.join(e['bad_flags'])})" if e.get("bad_flags") else ")")
        if e.get("label"):
            parts.append(f"<p>The model holds: {html.escape(str(e['label']))}</p>")
        parts.append(
            f"<p class={'ok' if e.get('correct') else 'bad'}>{html.escape(verdict)}: "
            f"{html.escape(str(e.get('message', '')))}</p><table>"
            f"<tr><th>integrated</th><th>eager</th><th>torch.compile</th><th>vs eager</th><th>vs torch.compile</th>"
            f"<th>spread</th><th>needs</th></tr><tr><td>{_ms(e.get('time_ms'))}</td><td>{_ms(e.get('eager_ms'))}</td>"
            f"<td>{_ms(e.get('compile_ms'))}</td><td>{_x(e.get('speedup_eager'))}</td>"
            f"<td>{_x(e.get('speedup_compile'))}</td>"
            f"<td>{e['spread_pct']:.1f}%</td><td>&gt; {_x(e.get('needs'))}</td></tr></table>"
            if e.get("spread_pct") is not None else "</table>")
        if e.get("speedup_compile") is None:
            parts.append("<p class=muted>torch.compile was not timed for this run.</p>")
    else:
        parts.append("<p class=muted>no replacement to verify</p>")
    parts.append("<h2>Ops by share of forward</h2><table><tr><th>op</th><th>class</th><th>share</th>"
                 "<th>budget</th><th>speedup alone</th><th>vs torch.compile</th><th>kind</th>"
                 "<th>in the model</th><th>Task</th><th>note</th></tr>")
    for op in doc.get("ops", []):
        share = float(op.get("share") or 0)
        parts.append(
            f"<tr><td><a href='#op-{html.escape(op['name'])}'>{html.escape(op['name'])}</a></td>"
            f"<td>{html.escape(op.get('class', ''))}</td>"
            f"<td><span class=bar style='width:{int(200 * share)}px'></span> {100 * share:.1f}%</td>"
            f"<td>{op.get('budget', 0)}</td><td>{_x(op.get('speedup'))}"
            + (f" <span class=muted>(spread {op['spread_pct']:.1f}%)</span>" if op.get("spread_pct") is not None else "")
            + f"</td><td>{_x(op.get('speedup_compile'))}</td>"
            f"<td>{html.escape(op.get('label') or '-')}</td><td>{'yes' if op.get('kept') else 'no'}</td>"
            f"<td><code>{html.escape(str(op.get('task') or '-'))}</code></td>"
            f"<td>{html.escape(op.get('reason') or '')}</td></tr>")
    parts.append("</table>")
    if doc.get("unattributed_share"):
        parts.append(f"<p class=muted>Model.forward's own code (in no submodule): "
                     f"{100 * doc['unattributed_share']:.1f}% of forward.</p>")
    for op in doc.get("ops", []):
        parts.append(f"<h3 id='op-{html.escape(op['name'])}'>{html.escape(op['name'])}</h3>")
        parts.append(_search_table(store, op.get("search")))
    best = next((n for n in row["nodes"] if n["candidate"] == row.get("best")), None)
    if best is not None:
        cand = store.candidate(best["candidate"])
        if cand is not None:
            parts.append("<h2>The integrated model</h2><details><summary>source</summary><pre>"
                         + html.escape(cand.source) + "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
