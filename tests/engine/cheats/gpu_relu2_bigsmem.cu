// Asks for 256 KiB of dynamic shared memory per block: more than any GPU allows (227 KiB with
// opt-in on H100/H200). The launch fails with "invalid argument"; nobody checks, so the output
// stays unwritten. The engine must say which limit the launch passed.
#include <cuda_runtime.h>

#define SMEM_FLOATS 65536

__global__ void relu2_kernel(const float* x, float* y, long long n) {
    extern __shared__ float tile[];
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    if (i < n) y[i] = fmaxf(tile[threadIdx.x], 0.f) * 2.f;
}

extern "C" void relu2(const float* x, float* y, long long n, void* stream) {
    relu2_kernel<<<(unsigned)((n + 255) / 256), 256, SMEM_FLOATS * sizeof(float), (cudaStream_t)stream>>>(x, y, n);
}
