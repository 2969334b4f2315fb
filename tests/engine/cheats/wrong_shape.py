"""Drops the last column."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.einsum("bi,oi->bo", x, self.linear.weight) + self.linear.bias
        y = y.clamp(min=0)
        return (y + y)[:, :-1].contiguous()
