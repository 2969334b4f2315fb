// Writes only the first half of the output (a grid too small): the rest stays unwritten.
#include <cuda_runtime.h>

__global__ void relu2_kernel(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) * 2.f;
}

extern "C" void relu2(const float* x, float* y, long long n, void* stream) {
    long long half = n / 2;
    relu2_kernel<<<(unsigned)((half + 255) / 256), 256, 0, (cudaStream_t)stream>>>(x, y, half);
}
