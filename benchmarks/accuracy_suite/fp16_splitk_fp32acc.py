"""An fp16 GEMM: split-K with the partial products accumulated in fp32, rounded to fp16 once.
EXPECTED: correct (fp16 variant)."""
import torch
import torch.nn as nn

EXPECTED = "correct"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        splits = 4
        k = A.shape[1] // splits
        a = A.float().reshape(A.shape[0], splits, k).transpose(0, 1)
        parts = torch.bmm(a, B.float().reshape(splits, k, B.shape[1]))
        return parts.sum(dim=0).to(A.dtype)


def get_inputs():
    return [torch.randn(128, 2048, dtype=torch.float16), torch.randn(2048, 128, dtype=torch.float16)]


def get_init_inputs():
    return []
