"""KernelBench-format task with its candidate: softmax over the last dim of a 2-D tensor.

`ModelNew` uses a one-block-per-row CUDA kernel (shared-memory tree reductions) built with
torch.utils.cpp_extension.load_inline, as a KernelBench candidate would.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

BATCH, DIM = 4096, 4096  # 64 MB in


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(BATCH, DIM, device=device)]


def get_init_inputs():
    return []


softmax_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define THREADS 256

__global__ void row_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[THREADS];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;

    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, row[c]);
    buf[threadIdx.x] = m;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + s]);
        __syncthreads();
    }
    m = buf[0];
    __syncthreads();

    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) sum += expf(row[c] - m);
    buf[threadIdx.x] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = 1.0f / buf[0];

    for (int c = threadIdx.x; c < cols; c += THREADS) out[c] = expf(row[c] - m) * inv;
}

torch::Tensor row_softmax_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2, "x must be a 2-D CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int rows = xc.size(0), cols = xc.size(1);
    row_softmax_kernel<<<rows, THREADS>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "row_softmax_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

softmax_cpp_source = "torch::Tensor row_softmax_cuda(torch::Tensor x);"

row_softmax = load_inline(
    name="row_softmax",
    cpp_sources=softmax_cpp_source,
    cuda_sources=softmax_source,
    functions=["row_softmax_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.row_softmax = row_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.row_softmax.row_softmax_cuda(x)
