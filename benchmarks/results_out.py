"""Where a benchmark's table goes: printed, and kept as <stem>.json and <stem>.md in its folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out_dir: str | Path, stem: str, doc: Any, md: str) -> None:
    print(md)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{stem}.md").write_text(md)
