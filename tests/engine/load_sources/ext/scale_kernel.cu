// A load() source: kernels and the torch-facing function; the bindings are in bindings.cpp.
#include <torch/extension.h>

#ifdef KLSP_CPP_FLAG
#error "extra_cflags reach only the .cpp files (torch passes them to the host compiler, not nvcc)"
#endif

namespace {
constexpr int kThreads = 256;
}

template <typename scalar_t>
__global__ void scale_add_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, scalar_t s, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s + scalar_t(KLSP_BIAS);  // KLSP_BIAS: from extra_cuda_cflags
}

torch::Tensor scale_add(torch::Tensor x, double s) {
    static_assert(KLSP_HOST_ONLY == 1, "-Xcompiler flags reach the host code of a .cu");
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x: a contiguous CUDA tensor");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    const int blocks = (int)((n + kThreads - 1) / kThreads);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale_add", ([&] {
        scale_add_kernel<scalar_t><<<blocks, kThreads>>>(
            x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), static_cast<scalar_t>(s), n);
    }));
    return y;
}
