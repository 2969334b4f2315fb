"""KernelBench-format task with its candidate: y = relu(x) * scale.

`Model` is the reference; `ModelNew` replaces it with one fused CUDA kernel built through
torch.utils.cpp_extension.load_inline, the way KernelBench candidates are written.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

BATCH, DIM = 4096, 8192  # 128 MB in


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.scale


def get_inputs():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(BATCH, DIM, device=device)]


def get_init_inputs():
    return [1.7]


relu_scale_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_scale_kernel(const float* __restrict__ x, float* __restrict__ y,
                                  float scale, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = (v > 0.0f ? v : 0.0f) * scale;
    }
}

torch::Tensor relu_scale_cuda(torch::Tensor x, double scale) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const long long n = xc.numel();
    const int threads = 256;
    const long long blocks = (n + threads - 1) / threads;
    relu_scale_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), (float)scale, n);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "relu_scale_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

relu_scale_cpp_source = "torch::Tensor relu_scale_cuda(torch::Tensor x, double scale);"

relu_scale = load_inline(
    name="relu_scale",
    cpp_sources=relu_scale_cpp_source,
    cuda_sources=relu_scale_source,
    functions=["relu_scale_cuda"],
    extra_include_paths=[],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.relu_scale = relu_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu_scale.relu_scale_cuda(x, self.scale)
