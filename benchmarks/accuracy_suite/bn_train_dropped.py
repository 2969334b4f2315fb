"""Linear -> BatchNorm1d -> tanh, whose candidate silently drops BatchNorm and tanh in training
mode (KernelBench runs models in training mode). Right in eval mode only.
EXPECTED: eval_only (correct, flagged, not counted)."""
import torch
import torch.nn as nn

EXPECTED = "eval_only"


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.bn = nn.BatchNorm1d(n)

    def forward(self, x):
        return torch.tanh(self.bn(self.linear(x)))


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.bn = nn.BatchNorm1d(n)

    def forward(self, x):
        y = self.linear(x)
        if self.training:
            return y
        scale = self.bn.weight * torch.rsqrt(self.bn.running_var + self.bn.eps)
        return torch.tanh((y - self.bn.running_mean) * scale + self.bn.bias)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
