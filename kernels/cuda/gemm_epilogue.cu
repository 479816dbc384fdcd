// The GEMM epilogue as its own kernel, for what cuBLASLt did not fuse (see kernels/cuda/gemm.h):
// c = GELU?(c + bias) over a batch of row-major (m, n) matrices, or over zeros when k == 0.
// Computes in float32 (float64 for double) with the same GELU as the CPU (kernels/common).
#include <algorithm>

#include "../common/half.h"
#include "../common/unary_math.h"
#include "gemm.h"

namespace strata::cuda_kernels {

namespace {

constexpr int kEpilogueThreads = 256;

template <class T>
__global__ void epilogue_kernel(int64_t total, int64_t m, int64_t n, T* c, int64_t ldc, int64_t batch_stride,
                                const T* bias, bool gelu, bool zero) {
  using C = compute_t<T>;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t r = i / n, j = i - r * n;  // r counts rows over all batches
    const int64_t b = r / m, row = r - b * m;
    T* p = c + b * batch_stride + row * ldc + j;
    C v = zero ? C(0) : static_cast<C>(*p);
    if (bias) v += static_cast<C>(bias[j]);
    if (gelu) v = math::GeluTanh{}(v);
    *p = static_cast<T>(v);
  }
}

template <class T>
cudaError_t launch(int64_t batch, int64_t m, int64_t n, void* c, int64_t ldc, int64_t batch_stride, const void* bias,
                   bool gelu, bool zero, cudaStream_t stream) {
  const int64_t total = batch * m * n;
  if (total <= 0) return cudaSuccess;
  // a grid-stride loop: enough blocks to fill any GPU, never more than the grid allows
  const int64_t blocks = std::min<int64_t>((total + kEpilogueThreads - 1) / kEpilogueThreads, 65536);
  epilogue_kernel<T><<<static_cast<unsigned>(blocks), kEpilogueThreads, 0, stream>>>(
      total, m, n, static_cast<T*>(c), ldc, batch_stride, static_cast<const T*>(bias), gelu, zero);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemm_epilogue(GemmType type, int64_t batch, int64_t m, int64_t n, void* c, int64_t ldc,
                          int64_t batch_stride, const void* bias, bool gelu, bool zero, cudaStream_t stream) {
  switch (type) {
    case GemmType::F32: return launch<float>(batch, m, n, c, ldc, batch_stride, bias, gelu, zero, stream);
    case GemmType::F64: return launch<double>(batch, m, n, c, ldc, batch_stride, bias, gelu, zero, stream);
    case GemmType::F16: return launch<Half>(batch, m, n, c, ldc, batch_stride, bias, gelu, zero, stream);
    case GemmType::BF16: return launch<BFloat16>(batch, m, n, c, ldc, batch_stride, bias, gelu, zero, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace strata::cuda_kernels
