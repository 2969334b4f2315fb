"""Split-K GEMM (K = 32,768): eight partial products over slices of K, summed at the end (fp32
throughout). About PyTorch's own error; the fixed 1e-4 rejects it on an output near zero.
EXPECTED: correct."""
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
        splits = 8
        k = A.shape[1] // splits
        parts = torch.bmm(A.reshape(A.shape[0], splits, k).transpose(0, 1).contiguous(),
                          B.reshape(splits, k, B.shape[1]))
        return parts.sum(dim=0)


def get_inputs():
    return [torch.randn(128, 32768), torch.randn(32768, 128)]


def get_init_inputs():
    return []
