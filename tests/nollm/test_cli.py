"""`kernel-lsp optimize MODULE --proposer tuner` without a GPU: one sentence, exit 2, no traceback
(a real subprocess, with the GPU hidden so the test means the same on the device machine)."""

from __future__ import annotations

import json

from tests.cli.test_exit_codes import run_cli

PLAIN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def test_optimize_a_module_without_a_gpu_says_why(tmp_path):
    (tmp_path / "plain.py").write_text(PLAIN)
    r = run_cli("optimize", "plain.py", "--proposer", "tuner", "--budget", "2", "--json", cwd=tmp_path,
                env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["improved"] is False
    assert "needs a CUDA GPU" in doc["reason"] and "torch.compile writes its Triton kernels" in doc["reason"]
    assert "a module needs an LLM" not in r.stderr and "rewriting it needs an LLM" not in doc["reason"]
    assert "kernel-lsp optimize: could not run: writing this module's kernels needs a CUDA GPU" in r.stderr
    assert not (tmp_path / "plain.py").read_text() != PLAIN  # nothing written
