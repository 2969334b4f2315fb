"""An fp32 GEMM computed in fp16 inside (inputs rounded to fp16, fp32 accumulation): quietly
lowered precision, about 800x PyTorch's error and 0.04 off on outputs near zero (beyond 1e-2).
EXPECTED: mismatch (never plainly correct)."""
import torch
import torch.nn as nn

EXPECTED = "mismatch"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A.half().float(), B.half().float())


def get_inputs():
    return [torch.randn(256, 1024), torch.randn(1024, 256)]


def get_init_inputs():
    return []
