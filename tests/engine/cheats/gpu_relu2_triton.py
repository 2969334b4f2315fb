"""A Triton candidate for gpu_relu2.py: correct, one fused pass."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu2(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0) * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        _relu2[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        return y
