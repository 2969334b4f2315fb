"""A fused LayerNorm with a two-pass (centred) variance: the same formula, other rounding.
EXPECTED: correct."""
import torch
import torch.nn as nn

EXPECTED = "correct"


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = nn.LayerNorm(n)

    def forward(self, x):
        return self.ln(x)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = nn.LayerNorm(n)

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        var = (centred * centred).mean(dim=-1, keepdim=True)
        return centred / torch.sqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias


def get_inputs():
    return [torch.randn(64, 8192) * 0.5 + 100.0]


def get_init_inputs():
    return [8192]
