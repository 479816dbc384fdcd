// Warp and block all-reductions for kernels that reduce one row per warp or per block
// (layer norm, cross entropy), and the warp shuffle reduce.cuh also uses. The value may be any
// trivially copyable type (a float, a double, a small struct of them); `merge` must be
// commutative so that every lane of the xor butterfly ends with the same bits. Partial values
// meet in a fixed order, so results are deterministic from run to run.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

namespace strata::cuda_kernels {

inline constexpr int kWarpSize = 32;

/// v from the lane lane_mask away in the xor butterfly, moved as 32-bit words (any trivially
/// copyable V; bool and 8- or 16-bit values travel widened).
template <class V>
__device__ __forceinline__ V shfl_xor(const V& v, int lane_mask) {
  constexpr int kWords = (sizeof(V) + 3) / 4;
  unsigned int w[kWords] = {};
  memcpy(w, &v, sizeof(V));
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = __shfl_xor_sync(0xffffffffu, w[k], lane_mask);
  V out;
  memcpy(&out, w, sizeof(V));
  return out;
}

/// Every lane of a full warp receives merge over the 32 lanes' values.
template <class V, class Merge>
__device__ __forceinline__ V warp_allreduce(V v, Merge merge) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v = merge(v, shfl_xor(v, mask));
  return v;
}

/// Every thread of the block receives merge over all threads' values. blockDim.x is a
/// multiple of 32 (at most 1024) and every thread calls it; `scratch` is shared memory of 32
/// values, free again on return.
template <class V, class Merge>
__device__ __forceinline__ V block_allreduce(V v, Merge merge, V* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_allreduce(v, merge);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V total = scratch[0];
  for (int k = 1; k < warps; ++k) total = merge(total, scratch[k]);
  __syncthreads();  // scratch may be reused by the next call
  return total;
}

struct Plus {
  template <class V>
  __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
};

}  // namespace strata::cuda_kernels
