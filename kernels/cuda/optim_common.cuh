// What the CUDA optimizer kernels (kernels/cuda/optim*.cu) share: launch shape, the group
// constants rounded from double to the parameter's type, per-tensor Adam scalars, and a
// deterministic block sum.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "../common/optim_math.h"
#include "multi_tensor.cuh"

namespace strata::cuda_kernels::optim {

namespace mt = multi_tensor;

// 512 threads take a 16384-element chunk in 32 coalesced sweeps: enough blocks for a large
// parameter to fill the GPU, few enough that a small one costs one block.
inline constexpr int kThreads = 512;
inline constexpr int64_t kChunk = 16384;

// Each tensor's Adam step scalars (its step count may differ from the group's other tensors).
struct AdamExtra {
  double step_size, bc2_sqrt;
  const double* dev = nullptr;  // when set, {step_size, bc2_sqrt, decay} on the device (a CUDA graph's)
};

// Group constants, computed in double on the host (as for the CPU), rounded once to T.
template <class T>
math::SgdConsts<T> to_t(const math::SgdConsts<double>& c) {
  return {T(c.lr), T(c.momentum), T(c.one_minus_dampening), T(c.weight_decay), c.nesterov, c.maximize};
}
template <class T>
math::AdamConsts<T> to_t(const math::AdamConsts<double>& c) {
  return {T(c.beta1), T(c.beta2), T(c.one_minus_beta1), T(c.one_minus_beta2), T(c.eps),
          T(c.weight_decay), T(c.decay), T(c.step_size), T(c.bc2_sqrt), c.maximize};
}
template <class T>
math::AdagradConsts<T> to_t(const math::AdagradConsts<double>& c) {
  return {T(c.clr), T(c.weight_decay), T(c.eps), c.maximize};
}
template <class T>
math::RmspropConsts<T> to_t(const math::RmspropConsts<double>& c) {
  return {T(c.lr), T(c.alpha), T(c.one_minus_alpha), T(c.eps), T(c.weight_decay), T(c.momentum), c.maximize};
}
template <class T>
math::LambConsts<T> to_t(const math::LambConsts<double>& c) {
  return {T(c.beta1), T(c.beta2), T(c.one_minus_beta1), T(c.one_minus_beta2), T(c.eps),
          T(c.weight_decay), T(c.bc1), T(c.bc2), c.maximize};
}

/// Sums a and b over the block (blockDim.x == kThreads) in a fixed order, so the result does
/// not depend on timing; thread 0 gets the totals. Every thread must call it.
__device__ __forceinline__ void block_sum2(double& a, double& b) {
  constexpr int kWarps = kThreads / 32;
  __shared__ double part[2][kWarps];
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, off);
    b += __shfl_down_sync(0xffffffffu, b, off);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) part[0][warp] = a, part[1][warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    a = b = 0;
    for (int w = 0; w < kWarps; ++w) a += part[0][w], b += part[1][w];
  }
}

}  // namespace strata::cuda_kernels::optim
