"""LayerNorm over the last dim with learned weight and bias (float32), standing in for
layernorm.cu's layernorm_forward. The weights come from the Model."""

import ctypes

import torch
import torch.nn as nn

ROWS, COLS = 8192, 2048  # 64 MB in, 64 MB out
ENTRY = "layernorm_forward"


class Model(nn.Module):
    def __init__(self, cols: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(cols, eps=eps)
        # Random affine parameters, so a kernel that ignores them cannot pass.
        with torch.no_grad():
            self.norm.weight.copy_(torch.randn(cols) * 0.5 + 1.0)
            self.norm.bias.copy_(torch.randn(cols) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(ROWS, COLS, device=device, dtype=torch.float32) * 2.0 + 0.5]


def get_init_inputs():
    return [COLS]


def kernel_forward(lib, model, x):
    x = x.contiguous()
    y = torch.empty_like(x)
    rows, cols = x.shape
    weight = model.norm.weight.detach().to(device=x.device, dtype=torch.float32).contiguous()
    bias = model.norm.bias.detach().to(device=x.device, dtype=torch.float32).contiguous()
    err = lib.layernorm_forward(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(weight.data_ptr()),
                                ctypes.c_void_p(bias.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                                ctypes.c_int(rows), ctypes.c_int(cols), ctypes.c_float(model.norm.eps),
                                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if err != 0:
        raise RuntimeError(f"layernorm_forward failed with CUDA error {err}")
    return y
