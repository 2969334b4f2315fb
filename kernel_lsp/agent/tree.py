"""The Search's tree: nodes, which one to expand next, and the values backed up through it.

A node's value is what its subtree found: each evaluated child backs its speedup over the start
up to the root (a failing or disqualified child backs 0, so a subtree that keeps failing loses
its pull). Selection is UCB on q = (best + mean) / 2 of a subtree's values: the best because a
kernel search keeps its maximum, the mean so one lucky child does not hold a subtree forever.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import tokenize
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kernel_lsp.model import Candidate, Evaluation


@dataclass
class Node:
    candidate: Candidate
    depth: int
    parent: str | None
    evaluation: Evaluation | None = None
    speedup: float | None = None         # vs the starting source, from this Search's timings
    visits: int = 0                      # expansions through this node, and values backed up
    children: int = 0
    repairs_left: int = 0
    repaired: bool = False               # a repair of this node produced a candidate already
    exhausted: bool = False
    profile: dict[str, Any] | None = None
    step: int = 0
    confirmed_speedup: float | None = None   # from the final confirmation run, when re-timed there
    confirmed_evaluation: Evaluation | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)  # the turns that made it
    value_sum: float = 0.0               # the subtree's backed-up values
    value_count: int = 0
    best_value: float | None = None
    directions: int = 0                  # directions handed to its children so far

    @property
    def id(self) -> str:
        return self.candidate.id

    @property
    def q(self) -> float:
        """The subtree's worth: the mean of best and average backed-up value (own speedup before any)."""
        if self.value_count == 0 or self.best_value is None:
            return self.speedup if self.speedup is not None else 1.0
        return 0.5 * (self.best_value + self.value_sum / self.value_count)


def path_to_root(nodes: dict[str, Node], node: Node) -> Iterable[Node]:
    cur: Node | None = node
    while cur is not None:
        yield cur
        cur = nodes.get(cur.parent) if cur.parent is not None else None


def visit(nodes: dict[str, Node], node: Node) -> None:
    """An expansion went through `node`: count it on its path."""
    for n in path_to_root(nodes, node):
        n.visits += 1


def backup(nodes: dict[str, Node], child: Node, value: float) -> None:
    """Back `value` (the child's speedup, 0 for a failure) up from the child's parent to the root."""
    parent = nodes.get(child.parent) if child.parent is not None else None
    if parent is None:
        return
    for n in path_to_root(nodes, parent):
        n.value_sum += value
        n.value_count += 1
        n.best_value = value if n.best_value is None else max(n.best_value, value)


def ucb_pick(open_nodes: list[Node], total_visits: int, exploration: float) -> Node:
    def score(n: Node) -> tuple[float, int]:
        explore = exploration * math.sqrt(math.log(total_visits + 2) / (n.visits + 1))
        return n.q + explore, n.depth

    return max(open_nodes, key=score)


def pick_repair(nodes: Iterable[Node], needs_repair: Callable[[Node], bool]) -> Node | None:
    """The newest node that needs a repair and has repairs left (its lineage's bound)."""
    failing = [n for n in nodes if needs_repair(n) and n.repairs_left > 0 and not n.repaired]
    return max(failing, key=lambda n: n.step) if failing else None


_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _python_without_comments(source: str) -> str:
    """Python's own comments only, found by its tokenizer: a `#define` inside a CUDA string is code."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return source  # unparsable text: compare it as written
    return tokenize.untokenize((t.type, t.string) for t in tokens if t.type != tokenize.COMMENT)


def near_key(source: str, kind: str) -> str:
    """Two sources with the same key differ only in comments and whitespace: one is a
    near-duplicate of the other (byte equality misses a re-indented or re-commented copy)."""
    # Python: its `#` comments only (`a // b` is a division, `#define` in a string is CUDA);
    # CUDA: // and /* */ comments.
    text = _python_without_comments(source) if kind == "python" else _C_COMMENT.sub(" ", source)
    text = re.sub(r"\s+", " ", text).strip()
    return hashlib.sha256(text.encode()).hexdigest()[:24]
