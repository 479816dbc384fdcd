// Launch sizes for grid-stride kernels, shared by the kernels that walk a flat index.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda_kernels {

// Blocks for n elements at `threads` per block, capped: grid-stride loops cover the rest.
inline int grid_stride_blocks(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65536 ? blocks : 65536);
}

// Runs launch(index_tag) with a 32-bit flat index type when `total` allows, else 64-bit.
template <class Launch>
cudaError_t launch_indexed(int64_t total, const Launch& launch) {
  if (total <= 0) return cudaSuccess;
  if (total < (int64_t(1) << 31)) launch(uint32_t{});
  else launch(uint64_t{});
  return cudaGetLastError();
}

}  // namespace strata::cuda_kernels
