// Walking a StridedLoop by element offsets instead of values, for kernels that compute an
// address from data (gather, scatter) or need the coordinates of a position (sort slices,
// triangles). Positions count innermost dim fastest, as in elementwise.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "../common/strided_loop.h"

namespace strata::cpu {

/// Each operand's element offset at linear position `pos` of the loop.
template <int N>
inline std::array<int64_t, N> offsets_at(const StridedLoop<N>& loop, int64_t pos) {
  std::array<int64_t, N> off{};
  for (int d = 0; d < loop.ndim; ++d) {
    int64_t i = pos % loop.shape[d];
    pos /= loop.shape[d];
    for (int k = 0; k < N; ++k) off[k] += i * loop.strides[k][d];
  }
  return off;
}

/// Calls row(off, n, step) for each run of positions in [begin, end) that lies along the
/// innermost dim: operand k's elements of the run are at off[k] + j * step[k], j in [0, n).
template <int N, class Row>
void for_each_row(const StridedLoop<N>& loop, int64_t begin, int64_t end, const Row& row) {
  if (begin >= end) return;
  std::array<int64_t, N> off{}, step{};
  if (loop.ndim == 0) {  // a single element
    row(off, end - begin, step);
    return;
  }
  int64_t idx[kMaxLoopDims];
  int64_t rem = begin;
  for (int d = 0; d < loop.ndim; ++d) {
    idx[d] = rem % loop.shape[d];
    rem /= loop.shape[d];
    for (int k = 0; k < N; ++k) off[k] += idx[d] * loop.strides[k][d];
  }
  for (int k = 0; k < N; ++k) step[k] = loop.strides[k][0];
  int64_t pos = begin;
  for (;;) {
    int64_t n = std::min(loop.shape[0] - idx[0], end - pos);
    row(off, n, step);
    pos += n;
    if (pos >= end) return;
    // the row ended at the end of dim 0: rewind it and carry into the outer dims
    for (int k = 0; k < N; ++k) off[k] -= idx[0] * step[k];
    idx[0] = 0;
    for (int d = 1; d < loop.ndim; ++d) {
      ++idx[d];
      for (int k = 0; k < N; ++k) off[k] += loop.strides[k][d];
      if (idx[d] < loop.shape[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= loop.shape[d] * loop.strides[k][d];
      idx[d] = 0;
    }
  }
}

}  // namespace strata::cpu
