"""Returns an output it never wrote past row 16 (a launch that covers half the grid)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.linear.out_features)
        y = torch.einsum("bi,oi->bo", x[:16], self.linear.weight) + self.linear.bias
        y = y.clamp(min=0)
        out[:16] = y + y
        return out
