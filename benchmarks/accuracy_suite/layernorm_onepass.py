"""LayerNorm with a one-pass variance, E[x^2] - E[x]^2 in fp32, on rows whose mean is 200 times
their spread (un-centred activations): the subtraction cancels about four digits.
EXPECTED: less_accurate (a numerically weak formula; at a mean 10x the spread it is correct)."""
import torch
import torch.nn as nn

EXPECTED = "less_accurate"


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
        var = (x * x).mean(dim=-1, keepdim=True) - mean * mean
        return (x - mean) * torch.rsqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias


def get_inputs():
    return [torch.randn(64, 8192) * 0.5 + 100.0]


def get_init_inputs():
    return [8192]
