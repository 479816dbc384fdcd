// CUDA dropout with the CPU's Philox stream (kernels/cpu/dropout.h, Note [Random stream
// layout] in kernels/common/philox.h): one thread per Philox block of four elements, so for
// a seed and offset the mask is the CPU's bit for bit.
#include "../common/convert.h"
#include "../common/philox.h"
#include "elementwise.cuh"
#include "index_ops.h"

namespace strata::cuda_kernels {

namespace {

template <class T>
__global__ void dropout_kernel(int64_t n, const T* __restrict__ x, T* __restrict__ y, T* __restrict__ mask, float p,
                               compute_t<T> scale, uint64_t seed, uint64_t offset, const uint64_t* state) {
  using C = compute_t<T>;
  if (state) {  // a graph replay's draw
    seed = state[0];
    offset = state[1];
  }
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t blk = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; blk < blocks; blk += step) {
    const philox::Block r = philox::philox4x32_10(offset + static_cast<uint64_t>(blk), seed);
    const int64_t i0 = blk * 4;
    const int len = n - i0 < 4 ? static_cast<int>(n - i0) : 4;
    for (int l = 0; l < len; ++l) {
      const C m = philox::dropout_factor(philox::lane(r, static_cast<unsigned>(l)), p, scale);
      mask[i0 + l] = convert<T>(m);
      y[i0 + l] = convert<T>(static_cast<C>(x[i0 + l]) * m);
    }
  }
}

}  // namespace

template <class T>
cudaError_t dropout(int64_t n, cudaStream_t s, const T* x, T* y, T* mask, float p, double scale, uint64_t seed,
                    uint64_t offset, const uint64_t* state) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 3) / 4;
  // the CPU rounds the scale to the compute type once, before the loop
  dropout_kernel<<<grid_for(blocks), kThreads, 0, s>>>(n, x, y, mask, p, static_cast<compute_t<T>>(scale), seed,
                                                        offset, state);
  return cudaGetLastError();
}

template cudaError_t dropout<Half>(int64_t, cudaStream_t, const Half*, Half*, Half*, float, double, uint64_t,
                                   uint64_t, const uint64_t*);
template cudaError_t dropout<BFloat16>(int64_t, cudaStream_t, const BFloat16*, BFloat16*, BFloat16*, float, double,
                                       uint64_t, uint64_t, const uint64_t*);
template cudaError_t dropout<float>(int64_t, cudaStream_t, const float*, float*, float*, float, double, uint64_t,
                                    uint64_t, const uint64_t*);
template cudaError_t dropout<double>(int64_t, cudaStream_t, const double*, double*, double*, float, double, uint64_t,
                                     uint64_t, const uint64_t*);

}  // namespace strata::cuda_kernels
