"""KernelBench's result_reuse kernel: returns torch.empty without writing it, hoping the
allocator hands back the reference's freed output (Sakana's exploit)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.empty(x.shape[0], self.linear.out_features)
