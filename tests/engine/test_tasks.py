"""find_task: which reference and Candidate a file stands for (no torch needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernel_lsp.engine.caller.tasks import TaskError, find_task

REF = '''import torch
import torch.nn as nn
ATOL = 1e-3
RTOL = 2e-3

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
'''
NEW = '''import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp(min=0)
'''


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_reference_alone(tmp_path: Path) -> None:
    task, cand = find_task(str(write(tmp_path / "relu.py", REF)))
    assert cand is None
    assert task.name == "relu" and task.reference_source == REF
    assert task.atol == 1e-3 and task.rtol == 2e-3
    assert task.cuda_path is None


def test_reference_and_candidate_in_one_file(tmp_path: Path) -> None:
    text = REF + "\n" + NEW
    task, cand = find_task(str(write(tmp_path / "both.py", text)))
    assert cand is not None and cand.kind == "python" and cand.source == text
    assert task.reference_source == text


def test_unsaved_buffer_wins_over_disk(tmp_path: Path) -> None:
    path = write(tmp_path / "relu.py", REF)
    task, cand = find_task(str(path), text=REF + NEW)
    assert cand is not None and cand.source == REF + NEW


def test_kernelbench_pair_foo_new(tmp_path: Path) -> None:
    write(tmp_path / "relu.py", REF)
    task, cand = find_task(str(write(tmp_path / "relu_new.py", NEW)))
    assert task.name == "relu" and task.reference_path == str(tmp_path / "relu.py")
    assert cand is not None and cand.source == NEW and cand.kind == "python"


def test_ref_suffix_pair(tmp_path: Path) -> None:
    write(tmp_path / "relu_ref.py", REF)
    task, cand = find_task(str(write(tmp_path / "relu.py", NEW)))
    assert task.reference_path.endswith("relu_ref.py") and cand is not None


def test_reference_variable_points_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "refs").mkdir()
    write(tmp_path / "refs" / "base.py", REF)
    path = write(tmp_path / "try1.py", 'REFERENCE = "refs/base.py"\n' + NEW)
    task, _ = find_task(str(path))
    assert task.reference_path == str(tmp_path / "refs" / "base.py")


def test_candidate_without_reference_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"lonely_ref\.py"):
        find_task(str(write(tmp_path / "lonely.py", NEW)))


def test_incomplete_reference_names_missing_parts(tmp_path: Path) -> None:
    text = "import torch.nn as nn\nclass Model(nn.Module):\n    pass\n"
    with pytest.raises(TaskError, match="get_inputs.*get_init_inputs"):
        find_task(str(write(tmp_path / "half.py", text)))


def test_syntax_error_has_line(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"bad\.py:2: syntax error"):
        find_task(str(write(tmp_path / "bad.py", "x = 1\ndef (:\n")))


def test_not_a_task(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="not a Task"):
        find_task(str(write(tmp_path / "util.py", "def helper():\n    return 1\n")))


def test_bad_tolerance(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="ATOL"):
        find_task(str(write(tmp_path / "t.py", REF.replace("ATOL = 1e-3", 'ATOL = "loose"'))))


CU = 'extern "C" void relu_forward(const float* x, float* y, int n) {}\n'
HARNESS = REF + '\nENTRY = "relu_forward"\n\ndef kernel_forward(lib, model, x):\n    return x\n'


def test_cu_with_harness(tmp_path: Path) -> None:
    write(tmp_path / "relu.py", HARNESS)
    cu = write(tmp_path / "relu.cu", CU)
    task, cand = find_task(str(cu))
    assert cand is not None and cand.kind == "cuda" and cand.source == CU
    assert task.entry == "relu_forward" and task.cuda_path == str(cu)
    assert task.reference_path == str(tmp_path / "relu.py") and task.atol == 1e-3


def test_cu_buffer_text_used(tmp_path: Path) -> None:
    write(tmp_path / "relu.py", HARNESS)
    cu = write(tmp_path / "relu.cu", CU)
    _, cand = find_task(str(cu), text=CU + "// edited\n")
    assert cand is not None and cand.source.endswith("// edited\n")


def test_opening_the_harness_gives_the_cu_task(tmp_path: Path) -> None:
    harness = write(tmp_path / "relu.py", HARNESS)
    write(tmp_path / "relu.cu", CU)
    task, cand = find_task(str(harness))
    assert cand is not None and cand.kind == "cuda" and task.entry == "relu_forward"


def test_cu_without_harness(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"no harness: expected relu\.py"):
        find_task(str(write(tmp_path / "relu.cu", CU)))


def test_cu_harness_without_entry(tmp_path: Path) -> None:
    write(tmp_path / "relu.py", REF)
    with pytest.raises(TaskError, match="ENTRY"):
        find_task(str(write(tmp_path / "relu.cu", CU)))


def test_header_is_not_a_task(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="header"):
        find_task(str(write(tmp_path / "x.cuh", CU)))


def test_tasks_module_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, kernel_lsp.engine.caller.tasks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_latin1_comment_and_binary_files(tmp_path: Path) -> None:
    # A Latin-1 comment is no reason to refuse a kernel; a binary renamed .cu is a clear TaskError.
    cu = tmp_path / "relu.cu"
    cu.write_bytes(CU.encode() + b"// caf\xe9 au lait\n")
    write(tmp_path / "relu.py", HARNESS)
    task, cand = find_task(str(cu))
    assert cand is not None and cand.kind == "cuda" and "caf\ufffd au lait" in cand.source
    cu.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00binary")
    with pytest.raises(TaskError, match="looks binary"):
        find_task(str(cu))
