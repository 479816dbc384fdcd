// The CUDA kernel of scaled swish: one thread per element in a grid-stride loop, so any n
// (including n >= 2^31) runs with a bounded grid. Compiled only when CMake finds a CUDA
// compiler; swish_no_cuda.cpp stands in otherwise.
#include <cuda_runtime.h>

#include "swish_kernels.h"

namespace swish {

namespace {

__device__ inline float exp_(float v) { return expf(v); }
__device__ inline double exp_(double v) { return exp(v); }

template <class T>
__global__ void forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, T beta) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = x[i] / (T(1) + exp_(-beta * x[i]));
}

template <class T>
const char* launch(const T* x, T* y, int64_t n, T beta, int device, void* stream) {
  if (n == 0) return nullptr;
  int previous = 0;  // run on the tensor's GPU, leave the caller's current device as it was
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess && previous != device) err = cudaSetDevice(device);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  constexpr int kThreads = 256;
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
  forward_kernel<T><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n, beta);
  err = cudaGetLastError();  // launch errors only; the kernel runs asynchronously
  if (previous != device) cudaSetDevice(previous);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

bool cuda_compiled() { return true; }
const char* forward_cuda(const float* x, float* y, int64_t n, float beta, int device, void* stream) {
  return launch(x, y, n, beta, device, stream);
}
const char* forward_cuda(const double* x, double* y, int64_t n, double beta, int device, void* stream) {
  return launch(x, y, n, beta, device, stream);
}

}  // namespace swish
