"""What the server knows about one open document, in one place.

A `DocumentState` holds the text version, its parse, the last compile result and the last
Evaluation with the text it measured; features read and write their part of it, and
everything they show says which version a number came from. When the text no longer is
the text measured, the measurement is *stale* and every view says "edited since measured".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types

from kernel_lsp.model import CompileResult, Evaluation, ResourceUsage, Target
from kernel_lsp.server.positions import Positions
from kernel_lsp.source import Document


@dataclass
class Compiled:
    """The last compile of the document: its results, per-kernel resources and the version."""

    version: int | None
    text: str
    results: list[CompileResult]
    resources: dict[str, ResourceUsage]


@dataclass
class Measurement:
    """The last Evaluation of the document's Task, with the text it ran on.

    `text` is None when the Evaluation came from the store and does not match the open text
    (it measured some earlier text): it is shown as stale until the next measurement.
    `reference_only`: the file is a reference alone; `time` is the reference's own time.
    """

    evaluation: Evaluation
    version: int | None
    text: str | None
    reference_only: bool = False
    hot_ops: list[dict[str, Any]] = field(default_factory=list)
    sandboxed: bool | None = None
    shown_stale: bool = False  # what the published diagnostics say: republish only on a change

    def fresh_for(self, text: str) -> bool:
        return self.text is not None and self.text == text


@dataclass
class SavePublish:
    """A save whose compile and measurement publish their diagnostics together, once.

    `waiting`: the owners ("compile", "evaluation") whose result for `version` is still to come.
    """

    version: int | None
    waiting: set[str]


@dataclass
class DocumentState:
    uri: str
    path: str
    version: int | None
    text: str
    parse: Document | None = None
    compiled: Compiled | None = None
    measurement: Measurement | None = None
    # Diagnostics by owner (compile, resources, evaluation), published together, one message.
    diagnostics: dict[str, list[types.Diagnostic]] = field(default_factory=dict)
    # The text an Apply wrote: when the buffer holds it, it is measured again.
    remeasure_text: str | None = None
    store_read: bool = False  # the store's last Evaluation was looked up (once per open)
    # Set by a save that measures: its compile waits for the measurement, one publish for both.
    save_publish: SavePublish | None = None
    # What the latest build while typing did (server/build_ahead.py): version, state, seconds.
    built_ahead: dict[str, Any] | None = None
    # The measurement under way's early result (verdict and eager ratio, torch.compile pending)
    # and the job it belongs to: shown beside "measuring…" while that job runs and the text is
    # the one it measures (server/evaluation.py), dropped when the job ends.
    early: Measurement | None = None
    early_job: Any = None
    _parsing: asyncio.Future[None] | None = field(default=None, repr=False)
    _positions: tuple[str, Positions] | None = field(default=None, repr=False)
    _symbols: tuple[Document, list[dict[str, Any]]] | None = field(default=None, repr=False)
    _anchor: tuple[Document, Target | None] | None = field(default=None, repr=False)

    @property
    def is_cuda(self) -> bool:
        return self.path.endswith((".cu", ".cuh"))

    @property
    def is_python(self) -> bool:
        return self.path.endswith(".py")

    @property
    def stale(self) -> bool:
        """The text changed since the last measurement (or the measurement is of other text)."""
        return self.measurement is not None and not self.measurement.fresh_for(self.text)

    @property
    def compile_stale(self) -> bool:
        return self.compiled is not None and self.compiled.text != self.text

    def settle(self, owner: str, version: int | None) -> str:
        """What `owner`'s result for `version` does with the save's one publish: "alone" (no
        save waits for it: publish as usual), "wait" (another owner of the save is still
        running: keep the diagnostics, publish nothing) or "publish" (the last one: publish all)."""
        batch = self.save_publish
        if batch is None or batch.version != version or owner not in batch.waiting:
            return "alone"
        batch.waiting.discard(owner)
        if batch.waiting:
            return "wait"
        self.save_publish = None
        return "publish"

    def positions(self, encoding: str) -> Positions:
        if self._positions is None or self._positions[0] is not self.text:
            self._positions = (self.text, Positions(self.text, encoding))
        return self._positions[1]
