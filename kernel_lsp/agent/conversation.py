"""A lineage is a conversation. The start's expansion opens it with everything a kernel engineer
would hand over (the Task, the GPU, the toolchain, the numbers to beat, the current source with
line numbers, its evaluation); every later turn is the model's own answer followed by what that
answer got (verdict, evidence, diagnostics quoting their lines, times, profile) and the next
instruction. Long conversations are compacted, oldest first, and each compaction says what was
left out; no turn is ever dropped.
"""

from __future__ import annotations

import re
from typing import Any

from .context import describe_targets, describe_toolchain, op_source
from .prompts import SYSTEM, SYSTEM_TOOLS, describe_device, describe_evaluation, describe_profile, instruction, numbered
from .proposer import ProposalRequest

# About 25k tokens of turns before the oldest source copies are compacted (prompt size is
# what a model reads well and what the budget pays for; the newest source is always whole).
COMPACT_CHARS = 100_000
_FENCED = re.compile(r"```[\w+.#-]*\n(.*?)```", re.S)


def _lang(req: ProposalRequest) -> str:
    return "python" if req.parent.kind == "python" else "cuda"


def _current(req: ProposalRequest, what: str) -> str:
    kind = "a Python file defining ModelNew" if req.parent.kind == "python" else "a .cu file"
    return f"{what} ({kind}; line numbers are not part of the file):\n```{_lang(req)}\n{numbered(req.parent.source)}\n```"


def _tail(req: ProposalRequest) -> list[str]:
    parts = []
    if req.profile:
        parts.append("Profiler facts for the current source (per kernel, hottest first):\n"
                     + describe_profile(req.profile))
    if req.history:
        parts.append("Tried elsewhere in this search (other lineages; do not repeat):\n"
                     + "\n".join(f"- {h}" for h in req.history[-12:]))
    parts.append(instruction(req))
    return parts


def opening(req: ProposalRequest) -> str:
    """The first user message of a lineage."""
    task = req.task
    # The Worker's versions come with every Evaluation (device_info says only whether CUDA works).
    versions = dict(getattr(req.start_evaluation, "versions", None) or {})
    parts = [f"Task: {task.name}", describe_device(req.device), describe_toolchain({**req.device, **versions}),
             "Reference (KernelBench format, the ground truth):\n```python\n" + task.reference_source.rstrip()
             + "\n```"]
    op = op_source(task)
    if op:
        parts.append("The op's own code, from the user's model file (the reference builds it as `self.op`; "
                     "this is what forward runs):\n```python\n" + op + "\n```")
    targets = describe_targets(req.start_evaluation, req.evaluation, req.seed)
    if targets:
        parts.append(targets)
    if req.seed is not None and req.parent.id == req.seed.id:
        parts.append(seed_paragraph(req.seed))
        parts.append(_current(req, "Current source (the seed)"))
    else:
        parts.append(_current(req, "Current source"))
    parts.append("Its evaluation:\n" + describe_evaluation(req.evaluation, source=req.parent.source,
                                                           start=req.start_evaluation))
    return "\n\n".join(parts + _tail(req))


def seed_paragraph(seed: Any) -> str:
    """What the seed is and what it measured: the opening of a lineage that starts from it."""
    nums = [f"{seed.time_ms:.4f} ms" if seed.time_ms is not None else None,
            f"{seed.speedup:.2f}x vs the user's starting source" if seed.speedup else None,
            f"{seed.speedup_eager:.2f}x vs PyTorch eager" if seed.speedup_eager else None,
            f"{seed.speedup_compile:.2f}x vs torch.compile" if seed.speedup_compile else None]
    return (f"The current source is the seed: {seed.label}. kernel-lsp wrote it without an LLM from the "
            "Triton kernels torch.compile generates for this module at these input shapes on this GPU, and "
            f"verified it: {', '.join(n for n in nums if n)}. Build on it: a version is offered to the user "
            "only if it is faster than this seed as well as the starting source, by more than the measured noise.")


def follow_up(req: ProposalRequest) -> str:
    """The user turn after the model's answer made `req.parent`: what it got, and what next."""
    note = f' ("{req.parent.note}")' if req.parent.note else ""
    parts = [f"Your answer gave candidate {req.parent.id[:8]}{note}. Its evaluation:\n"
             + describe_evaluation(req.evaluation, source=req.parent.source, start=req.start_evaluation)]
    targets = describe_targets(req.start_evaluation, req.evaluation, req.seed)
    if targets:
        parts.append(targets)
    parts.append(_current(req, "Current source, as your answer made it"))
    return "\n\n".join(parts + _tail(req))


def unusable(why: str, patch: str | None) -> str:
    """The user turn after an answer that gave no source (a patch that did not apply, no code)."""
    text = f"Your answer could not be used: {why}."
    if patch:
        text += f"\nThe patch block that failed, whole:\n```\n{patch.rstrip()}\n```"
    return text + ("\nThe current source is unchanged (shown above with line numbers). Answer again: "
                   "copy SEARCH lines exactly (without the line numbers) and make each one unique, "
                   "or send the whole file in one fenced block.")


def _compact_calls(m: dict[str, Any], turn: int) -> None:
    """An earlier tool call's `source`/`patch` argument of more than 400 characters: a line saying so."""
    import json

    calls = []
    for call in m.get("tool_calls") or []:
        fn = dict(call.get("function") or {})
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = None
        if isinstance(args, dict):
            for key in ("source", "patch"):
                if isinstance(args.get(key), str) and len(args[key]) > 400:
                    args[key] = f"[compacted: {args[key].count(chr(10)) + 1} lines of {key} from turn {turn + 1}]"
            fn["arguments"] = json.dumps(args)
        calls.append({**call, "function": fn})
    m["tool_calls"] = calls


def size(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages)


def compact(turns: list[dict[str, Any]], limit: int = COMPACT_CHARS) -> list[dict[str, Any]]:
    """Oldest first, replace whole code blocks of earlier turns (never the last message, never
    the reference or the op's code in the opening) by a line saying what they held; then, if
    still too long, the middle of the oldest long messages, saying how much was left out."""
    out = [dict(m) for m in turns]
    if size(out) <= limit:
        return out
    for i, m in enumerate(out[:-1]):
        if m.get("tool_calls"):
            _compact_calls(m, i)
        content = m.get("content")
        if not isinstance(content, str):
            if size(out) <= limit:
                return out
            continue

        def shorten(match: re.Match[str], turn: int = i) -> str:
            body = match.group(1)
            if len(body) < 400 or (turn == 0 and not re.match(r"\s*\d+\| ", body)):
                return match.group(0)  # short, or the opening's reference / op code: kept
            return (f"```\n[compacted: {body.rstrip(chr(10)).count(chr(10)) + 1} lines of code from turn {turn + 1}; "
                    f"the current source is shown whole in the last message]\n```")

        m["content"] = _FENCED.sub(shorten, content)
        if size(out) <= limit:
            return out
    for i, m in enumerate(out[:-1]):
        content = m.get("content")
        if isinstance(content, str) and len(content) > 4000 and i > 0:
            cut = len(content) - 3000
            m["content"] = (content[:1500] + f"\n[compacted: {cut} chars of turn {i + 1} left out]\n"
                            + content[-1500:])
            if size(out) <= limit:
                break
    return out


def build_messages(req: ProposalRequest, tools: bool = False) -> list[dict[str, Any]]:
    """The messages of one request: the system prompt for the protocol, then the lineage's turns
    with this turn's user message (the opening for the start, else what the last answer got)."""
    turns = list(req.conversation)
    turns.append({"role": "user", "content": follow_up(req) if turns else opening(req)})
    return [{"role": "system", "content": SYSTEM_TOOLS if tools else SYSTEM}] + compact(turns)
