"""Linear -> BatchNorm1d -> tanh with the batch statistics in training mode and the running ones
in eval mode (and the running statistics updated as BatchNorm does). EXPECTED: correct."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECTED = "correct"


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
            mean = y.mean(dim=0)
            var = y.var(dim=0, unbiased=False)
            with torch.no_grad():
                m = self.bn.momentum
                self.bn.running_mean.mul_(1 - m).add_(m * mean)
                self.bn.running_var.mul_(1 - m).add_(m * y.var(dim=0, unbiased=True))
        else:
            mean, var = self.bn.running_mean, self.bn.running_var
        return torch.tanh((y - mean) * torch.rsqrt(var + self.bn.eps) * self.bn.weight + self.bn.bias)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
