// Correct values, but the work (and 4M cycles of spinning) runs on a private stream that is
// never joined back to the caller's stream: default-stream events alone would see almost nothing.
// It does wait for the caller's stream first (its input and output are ordered there).
#include <cuda_runtime.h>

__global__ void relu2_kernel(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) * 2.f;
}

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}

extern "C" void relu2(const float* x, float* y, long long n, void* stream) {
    static cudaStream_t side = nullptr;
    static cudaEvent_t ready = nullptr;
    if (side == nullptr) {
        cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
        cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    }
    cudaEventRecord(ready, (cudaStream_t)stream);
    cudaStreamWaitEvent(side, ready, 0);
    relu2_kernel<<<(unsigned)((n + 255) / 256), 256, 0, side>>>(x, y, n);
    spin<<<1, 1, 0, side>>>(4000000LL);
}
