"""A matrix-vector product that sums its 131,072 terms strictly in order, one fp32 FMA-free add
per term (what a one-thread-per-row kernel does); PyTorch's own sums are blocked.
EXPECTED: correct (tens of times PyTorch's error, about 1e-5 of the output's scale)."""
import torch
import torch.nn as nn

EXPECTED = "correct"
K = 131072


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        cols = A.t().contiguous()            # (K, M): one column of A per step
        b = B.reshape(-1)
        acc = torch.zeros(A.shape[0], dtype=A.dtype, device=A.device)
        for k in range(cols.shape[0]):       # in order, like the kernel's loop
            acc.add_(cols[k] * b[k])
        return acc.unsqueeze(1)


def get_inputs():
    return [torch.randn(8, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
