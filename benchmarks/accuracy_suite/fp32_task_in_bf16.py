"""An fp32 GEMM computed in bf16 inside (inputs rounded to bf16, fp32 accumulation): quietly
lowered precision, about 1e-2 off. EXPECTED: mismatch."""
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
        return torch.matmul(A.bfloat16().float(), B.bfloat16().float())


def get_inputs():
    return [torch.randn(256, 1024), torch.randn(1024, 256)]


def get_init_inputs():
    return []
