"""benchmarks/binding_coverage.py over a folder of solutions: calls with literal arguments are
counted, bound by signature or not (with the reason), and the signatures built ahead and those the
table binding serves are found."""

from __future__ import annotations

import json
import subprocess
import sys

from . import ROOT

SOLUTION = '''
from torch.utils.cpp_extension import load_inline
cpp = "torch::Tensor {name}(torch::Tensor x);"
ext = load_inline(name="e", cpp_sources=cpp, cuda_sources="", functions=["{name}"])
'''
DEFINED = '''
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="e", cpp_sources="int f(int a) {{ return a; }}", functions=["f"])
'''
COMPUTED = '''
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="e", cpp_sources=make(), functions=["f"])
'''


def test_the_coverage_of_a_folder_of_solutions(tmp_path) -> None:
    for i, name in enumerate(("relu", "gelu")):
        (tmp_path / f"s{i}.py").write_text(SOLUTION.format(name=name))
    (tmp_path / "d.py").write_text(DEFINED.format())
    (tmp_path / "c.py").write_text(COMPUTED)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "binding_coverage.py"), str(tmp_path),
                           "--out-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "binding_coverage.json").read_text())
    assert (doc["files"], doc["calls"], doc["unresolved"], doc["bound"], doc["distinct"]) == (4, 3, 1, 2, 1)
    assert doc["served_ahead"] == 2  # relu and gelu: one tensor in and out, the first built ahead
    assert doc["signatures"] == [{"signature": "torch::Tensor(torch::Tensor)", "calls": 2, "ahead": True,
                                  "table": "yes"}]
    assert doc["by_table"] == 2  # the table binding's one main.cpp serves both
    assert list(doc["kept_text"].values()) == [1] and "has a body" in next(iter(doc["kept_text"]))
    assert "**2 bound by signature**" in (out / "binding_coverage.md").read_text()
