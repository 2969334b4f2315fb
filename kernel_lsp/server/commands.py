"""The arguments of kernel-lsp's commands (`workspace/executeCommand`), typed.

Editors send one JSON object per command; it is structured into the record below with
cattrs (which lsprotocol brings), so a missing or mistyped field is one clear message to
the user, never a traceback.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import attrs
import cattrs

T = TypeVar("T")


@attrs.define(frozen=True)
class DocumentArgs:
    """check, benchmark, createHarness, fixCompileError: the document to act on."""

    uri: str


@attrs.define(frozen=True)
class OptimizeArgs:
    """optimize, tune. `op`: the hot op (from the profile's diagnostic) to work on first."""

    uri: str
    proposer: Literal["llm", "tuner"] | None = None
    op: str | None = None


@attrs.define(frozen=True)
class OpArgs:
    """optimizeOp: one submodule of the model's `Model` (its qualified name, e.g. "blocks.0.fc")."""

    uri: str
    op: str
    proposer: Literal["llm", "tuner"] | None = None


@attrs.define(frozen=True)
class JobArgs:
    """cancel: one job by id, or every visible job."""

    job: str | None = None


@attrs.define(frozen=True)
class SearchArgs:
    """previewCandidate, applyCandidate, showReport: a Search by id (the newest if omitted)."""

    search: int | None = None


_converter = cattrs.Converter()


class CommandError(ValueError):
    """Bad command arguments: the message is shown to the user as is."""


def parse_args(command: str, kind: type[T], args: tuple[Any, ...]) -> T:
    """The first argument of a command as `kind`; no argument is `{}`."""
    raw = args[0] if args else {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CommandError(f"{command} takes one object argument, got {type(raw).__name__}")
    fields = {f.name for f in attrs.fields(kind)}  # type: ignore[arg-type]
    try:
        return _converter.structure({k: v for k, v in raw.items() if k in fields}, kind)
    except Exception as exc:  # cattrs' grouped errors: name the fields
        wanted = ", ".join(f.name + ("?" if f.default is not attrs.NOTHING else "")
                           for f in attrs.fields(kind))  # type: ignore[arg-type]
        raise CommandError(f"{command} needs {{{wanted}}}; got {raw!r}") from exc

