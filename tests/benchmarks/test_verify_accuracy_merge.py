"""benchmarks/verify_accuracy.py --merge: runs on different cards keep each row's card."""

from __future__ import annotations

import json
from pathlib import Path

from . import load_script


def load():
    return load_script("verify_accuracy")


def run(path: Path, device: str, rows: list[dict]) -> Path:
    meta = {"date": "2026-12-05 14:00 UTC", "device": "cuda", "python": "3.12", "torch": "2.11",
            "device_name": device, "command": f"run on {device}", "seconds": 10.0}
    path.write_text(json.dumps({"meta": meta, "summary": {}, "rows": rows}))
    return path


def row(name: str, group: str, new: str = "correct") -> dict:
    return {"name": name, "group": group, "old": "correct", "new": new, "flags": []}


def test_merged_rows_keep_their_card_and_the_first_run_wins(tmp_path, monkeypatch):
    va = load()
    monkeypatch.setattr(va, "RESULTS", tmp_path)
    new = run(tmp_path / "new.json", "NVIDIA H100 80GB HBM3", [row("weak", "suite", "correct")])
    old = run(tmp_path / "old.json", "NVIDIA H200",
              [row("tasks/relu.cu", "tasks"), row("weak", "suite", "mismatch"), row("alpha", "suite")])
    va.merge([new, old], "merged")
    doc = json.loads((tmp_path / "merged.json").read_text())
    by = {r["name"]: r for r in doc["rows"]}
    assert by["weak"]["new"] == "correct" and by["weak"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert by["alpha"]["device_name"] == "NVIDIA H200"
    assert [r["name"] for r in doc["rows"]] == ["alpha", "weak", "tasks/relu.cu"]  # suite first, then tasks
    md = (tmp_path / "merged.md").read_text()
    assert "device: NVIDIA H200 (2 rows); NVIDIA H100 80GB HBM3: weak;" in md
