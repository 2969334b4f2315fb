"""Claims a kernel but calls the same PyTorch ops as the reference (F.linear, relu, mul)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.linear(x, self.linear.weight, self.linear.bias)) * 2.0
