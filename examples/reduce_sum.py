"""Sum over the last dim (float32), standing in for reduce_sum.cu's reduce_sum_forward."""

import ctypes

import torch
import torch.nn as nn

ROWS, COLS = 4096, 6144  # 96 MB in
ENTRY = "reduce_sum_forward"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1)


def get_inputs():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(ROWS, COLS, device=device)]


def get_init_inputs():
    return []


def kernel_forward(lib, model, x):
    x = x.contiguous()
    rows, cols = x.shape
    y = torch.empty(rows, device=x.device, dtype=x.dtype)
    err = lib.reduce_sum_forward(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                                 ctypes.c_int(rows), ctypes.c_int(cols),
                                 ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if err != 0:
        raise RuntimeError(f"reduce_sum_forward failed with CUDA error {err}")
    return y
