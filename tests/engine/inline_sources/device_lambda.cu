#include <torch/extension.h>
template <typename F>
__global__ void apply(float* x, int n, F f) { int i = threadIdx.x; if (i < n) x[i] = f(x[i]); }
torch::Tensor twice(torch::Tensor x) {
    int n = x.numel();
    apply<<<1, 256>>>(x.data_ptr<float>(), n, [] __device__ (float v) { return 2 * v; });
    return x;
}
