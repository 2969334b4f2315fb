"""A CPU test model (KernelBench format) for the whole-model flow: a Linear-GELU-LayerNorm
block whose three ops are written as row loops of different cost, so that plain-PyTorch
candidates beat each of them on a CPU and their shares of the time differ."""

import math

import torch
import torch.nn as nn

ROWS, DIM = 96, 128


class RowLinear(nn.Module):
    """y = x W^T + b, one row at a time (the costliest op)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / math.sqrt(in_features))
        self.bias = nn.Parameter(torch.randn(out_features) * 0.1)

    def forward(self, x):
        return torch.stack([torch.mv(self.weight, x[i]) + self.bias for i in range(x.shape[0])])


class ChunkGELU(nn.Module):
    """The erf GELU, four rows at a time (the cheapest op)."""

    def forward(self, x):
        return torch.cat([0.5 * x[i:i + 4] * (1.0 + torch.erf(x[i:i + 4] / math.sqrt(2.0)))
                          for i in range(0, x.shape[0], 4)])


class RowLayerNorm(nn.Module):
    """LayerNorm over the last dimension, one row at a time, with its affine weights."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        rows = []
        for i in range(x.shape[0]):
            r = x[i]
            mu = r.mean()
            var = ((r - mu) ** 2).mean()
            rows.append((r - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias)
        return torch.stack(rows)


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = RowLinear(dim, dim)
        self.act = ChunkGELU()
        self.norm = RowLayerNorm(dim)

    def forward(self, x):
        return self.norm(self.act(self.fc(x)))


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM]
