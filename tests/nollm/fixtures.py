"""The recorded Inductor modules under tests/data/inductor (see its README)."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "inductor"


def tasks() -> list[str]:
    return sorted(p.name for p in DATA.iterdir() if (p / "reference.py").exists())


def recordings() -> list[tuple[str, str]]:
    """(task, recorded module file name) for every recorded module."""
    return [(t, f.name) for t in tasks() for f in sorted((DATA / t).glob("*_0.py"))]


def load(task: str, module: str = "default_0.py") -> tuple[str, str, list[str] | None]:
    """(reference, recorded module, graph inputs): the inputs from the recorder's `<mode>.json`
    beside `<mode>_0.py`, or the early recordings' `args.json`, else None (guessed from shapes)."""
    d = DATA / task
    meta = d / (module.rsplit("_", 1)[0] + ".json")
    if meta.exists():
        args = json.loads(meta.read_text()).get("args")
    else:
        args = json.loads((d / "args.json").read_text()) if (d / "args.json").exists() else None
    return (d / "reference.py").read_text(), (d / module).read_text(), args

