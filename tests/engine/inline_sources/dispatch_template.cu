#include <torch/extension.h>
#include <cuda_runtime.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
constexpr int BLOCK = 256;

template <typename scalar_t>
__device__ __forceinline__ scalar_t gelu(scalar_t x) {
    return x * 0.5 * (1.0 + erf(x * 0.70710678));
}

template <typename scalar_t>
__global__ void __launch_bounds__(256) gelu_kernel(const scalar_t* __restrict__ in,
                                                   scalar_t* __restrict__ out, // output
                                                   int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu<scalar_t>(in[i]);
}

torch::Tensor gelu_forward(torch::Tensor x) {
    CHECK_CUDA(x);
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    const int blocks = (n + BLOCK - 1) / BLOCK;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gelu_forward", ([&] {
        gelu_kernel<scalar_t><<<blocks, BLOCK>>>(
            x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n);
    }));
    return out;
}
