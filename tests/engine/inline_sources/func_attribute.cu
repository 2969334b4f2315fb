#include <torch/extension.h>
__global__ void big_smem(float* x) { extern __shared__ float s[]; s[threadIdx.x] = x[threadIdx.x]; x[threadIdx.x] = s[0]; }
torch::Tensor run(torch::Tensor x) {
    cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);
    big_smem<<<1, 32, 100000>>>(x.data_ptr<float>());
    return x;
}
