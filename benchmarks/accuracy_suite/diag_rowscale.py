"""An algebraic shortcut: diag(A) @ B computed as a row scale, A[:, None] * B (KernelBench level 1
problem 12; 46.8x eager on an H200). It does none of the reference's N x N x M matmul and is exact.
EXPECTED: correct, flagged algebraic_shortcut (counted: it does less arithmetic than the
reference, checked on fresh input sets; never beyond_roofline, which only the bytes floor sets)."""
import torch
import torch.nn as nn

EXPECTED = "correct"
EXPECTED_FLAGS = ["algebraic_shortcut"]
N, M = 1024, 1024


class Model(nn.Module):
    def forward(self, A, B):
        return torch.diag(A) @ B


class ModelNew(nn.Module):
    def forward(self, A, B):
        return A.unsqueeze(1) * B


def get_inputs():
    return [torch.randn(N), torch.randn(N, M)]


def get_init_inputs():
    return []
