"""Reading a proposer's answer: a whole file in a fenced block, or SEARCH/REPLACE patches.

Anything else (prose only, empty, far too long, a patch against text that is not in
the source) is a `ParseError` with a reason the Search records as a failed step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEARCH_MARK = "<<<<<<< SEARCH"
DIVIDER = "======="
REPLACE_MARK = ">>>>>>> REPLACE"

_FENCE = re.compile(r"^(```+|~~~+)[ \t]*([\w+.#-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
_BLOCK = re.compile(
    r"^<{5,9} ?SEARCH[^\n]*\n(.*?)^={5,9}[ \t]*\n(.*?)^>{5,9} ?REPLACE[^\n]*$", re.S | re.M
)


class ParseError(ValueError):
    """The answer holds no usable source; the message says why, for the failed step."""

    def __init__(self, message: str, *, why: str = "unusable", patch: str | None = None) -> None:
        super().__init__(message)
        self.why = why        # "not found" | "not unique" | "malformed" | "unusable"
        self.patch = patch    # the failing SEARCH/REPLACE block, whole, to send back to the model


@dataclass
class Patch:
    search: str
    replace: str

    def text(self) -> str:
        return f"{SEARCH_MARK}\n{self.search}{DIVIDER}\n{self.replace}{REPLACE_MARK}"


# `  12| code`: the line-number prefix the prompt shows; a model may copy it into SEARCH lines.
_NUMBERED = re.compile(r"^ *\d+\| ?", re.M)


def _unnumbered(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and all(_NUMBERED.match(ln) for ln in lines):
        return _NUMBERED.sub("", text)
    return text


@dataclass
class ParsedAnswer:
    source: str
    form: str                 # "file" | "patch"
    patches: int = 0
    note: str = ""            # the answer's prose outside code, first line, for Candidate.note


def parse_patches(text: str) -> list[Patch]:
    return [Patch(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]


def apply_patches(source: str, patches: list[Patch]) -> str:
    """Apply each patch once, in order; exact match first, then one ignoring trailing blanks."""
    out = source
    for i, p in enumerate(patches, 1):
        if p.search == "":
            raise ParseError(f"patch {i}: empty SEARCH section", why="malformed", patch=p.text())
        p = Patch(_unnumbered(p.search), _unnumbered(p.replace)) if _NUMBERED.search(p.search) else p
        count = out.count(p.search)
        if count == 1:
            out = out.replace(p.search, p.replace, 1)
            continue
        if count > 1:
            raise ParseError(f"patch {i} of {len(patches)}: SEARCH text occurs {count} times; it must be unique "
                             "(add surrounding lines)", why="not unique", patch=p.text())
        fixed = _apply_loose(out, p)
        if fixed is None:
            first = p.search.strip().splitlines()[0][:80] if p.search.strip() else ""
            raise ParseError(f"patch {i} of {len(patches)}: SEARCH text not found in the current source "
                             f"(starts {first!r})", why="not found", patch=p.text())
        out = fixed
    return out


def _apply_loose(source: str, p: Patch) -> str | None:
    # Models often drop or add trailing whitespace; match line by line on rstripped text.
    want = [ln.rstrip() for ln in p.search.strip("\n").splitlines()]
    lines = source.splitlines(keepends=True)
    have = [ln.rstrip() for ln in lines]
    n = len(want)
    hits = [i for i in range(len(have) - n + 1) if have[i : i + n] == want]
    if len(hits) != 1:
        return None
    i = hits[0]
    repl = p.replace if p.replace.endswith("\n") or not p.replace else p.replace + "\n"
    return "".join(lines[:i]) + repl + "".join(lines[i + n :])


def _prose(text: str) -> str:
    stripped = _FENCE.sub("", _BLOCK.sub("", text)).strip()
    for line in stripped.splitlines():
        line = line.strip(" #*-")
        if line:
            return line[:200]
    return ""


def parse_answer(
    answer: str,
    current: str,
    *,
    kind: str,
    max_ratio: float = 10.0,
    min_limit: int = 20000,
) -> ParsedAnswer:
    """Turn a model's answer into a new source for a candidate of `kind` ("python"|"cuda")."""
    if answer is None or not answer.strip():
        raise ParseError("empty answer")
    limit = max(min_limit, int(max_ratio * len(current)))
    if len(answer) > limit:
        raise ParseError(f"answer too long ({len(answer)} chars, limit {limit})")
    note = _prose(answer)
    patches = parse_patches(answer)
    if patches:
        new = apply_patches(current, patches)
        form, count = "patch", len(patches)
    else:
        if SEARCH_MARK in answer or REPLACE_MARK in answer:
            at = answer.find(SEARCH_MARK) if SEARCH_MARK in answer else answer.find(REPLACE_MARK)
            raise ParseError("malformed SEARCH/REPLACE block (needs SEARCH, =======, REPLACE lines)",
                             why="malformed", patch=answer[max(0, at):at + 2000])
        blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(answer)]
        if not blocks:
            if "```" in answer:
                raise ParseError("unterminated code block")
            raise ParseError("no code block and no SEARCH/REPLACE patch in the answer (prose only)")
        new = _pick_block(blocks, kind)
        form, count = "file", 0
    if not new.strip():
        raise ParseError("the proposed source is empty")
    if new == current:
        raise ParseError("the proposed source is identical to the current one")
    if kind == "python" and "ModelNew" not in new:
        raise ParseError("the proposed Python file defines no ModelNew")
    return ParsedAnswer(source=new if new.endswith("\n") else new + "\n", form=form,
                        patches=count, note=note)


_LANGS = {
    "python": ("python", "py", "python3"),
    "cuda": ("cuda", "cu", "cpp", "c++", "c", "cuh"),
}


def _pick_block(blocks: list[tuple[str, str]], kind: str) -> str:
    # The largest block in the candidate's language; a model may add a short usage snippet.
    langs = _LANGS.get(kind, ())
    matching = [b for lang, b in blocks if lang in langs]
    pool = matching or [b for lang, b in blocks if lang == ""] or [b for _, b in blocks]
    return max(pool, key=len)
