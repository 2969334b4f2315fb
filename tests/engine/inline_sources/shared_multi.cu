#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <vector>

namespace {
struct Params { int rows; int cols; float scale; };

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    return v;
}

/* row sums with dynamic shared memory: "}" inside a comment and a string */
__global__ void row_sum_kernel(const float* x, float* y, Params p) {
    extern __shared__ float sdata[];
    const char* tag = "}{";
    (void)tag;
    float acc = 0.f;
    for (int c = threadIdx.x; c < p.cols; c += blockDim.x) acc += x[blockIdx.x * p.cols + c];
    sdata[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sdata[threadIdx.x] += sdata[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = warp_sum(0.f) + sdata[0] * p.scale;
}
}  // namespace

__global__ void scale_kernel(float* y, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= s;
}

torch::Tensor row_sum(torch::Tensor x, double scale) {
    auto y = torch::empty({x.size(0)}, x.options());
    Params p{(int)x.size(0), (int)x.size(1), 1.0f};
    const int threads = 256;
    cudaStream_t stream = 0;  // the legacy default stream
    row_sum_kernel<<<p.rows, threads, threads * sizeof(float), stream>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), p);
    scale_kernel<<<(p.rows + 255) / 256, 256, 0, stream>>>(y.data_ptr<float>(), (float)scale, p.rows);
    return y;
}
