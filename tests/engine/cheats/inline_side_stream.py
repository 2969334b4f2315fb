# A race that was credited (issue 20): the load_inline kernel runs on a stream the candidate
# makes with cudaStreamCreateWithFlags(..., cudaStreamNonBlocking) and never joins back to the
# caller's stream. PyTorch's next op, and the timer's events, wait only on the current stream.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    relu_kernel<<<(n + 255) / 256, 256, 0, s>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp_source = "torch::Tensor relu_cuda(torch::Tensor x);"

relu = load_inline(name="relu_side_stream", cpp_sources=cpp_source, cuda_sources=cuda_source,
                   functions=["relu_cuda"], verbose=False)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu.relu_cuda(x.contiguous())


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []
