"""y = gelu(x + bias) with exact GELU (float32), standing in for bias_gelu.cu's
bias_gelu_forward. The bias comes from the Model."""

import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 8192, 3072  # 96 MB in, 96 MB out (an MLP's hidden activation)
ENTRY = "bias_gelu_forward"


class Model(nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias)


def get_inputs():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(ROWS, COLS, device=device)]


def get_init_inputs():
    return [COLS]


def kernel_forward(lib, model, x):
    x = x.contiguous()
    y = torch.empty_like(x)
    bias = model.bias.detach().to(device=x.device, dtype=torch.float32).contiguous()
    err = lib.bias_gelu_forward(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(bias.data_ptr()),
                                ctypes.c_void_p(y.data_ptr()), ctypes.c_longlong(x.numel()),
                                ctypes.c_int(x.shape[-1]),
                                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if err != 0:
        raise RuntimeError(f"bias_gelu_forward failed with CUDA error {err}")
    return y
