"""Correct on the CPU, but switches on TF32 matmuls for everyone (precision lowering)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.backends.cuda.matmul.allow_tf32 = True
        y = torch.einsum("bi,oi->bo", x, self.linear.weight) + self.linear.bias
        y = y.clamp(min=0)
        return y + y
