// The layout an elementwise kernel walks: N operands (operand 0 is the output) over one
// shared, already broadcast shape. Dims are stored innermost first and have been coalesced
// where every operand is contiguous across them. Strides are in elements; a broadcast
// operand has stride 0.
#pragma once

#include <cstdint>

namespace strata {

inline constexpr int kMaxLoopDims = 25;

template <int N>
struct StridedLoop {
  int ndim = 0;
  int64_t numel = 0;
  int64_t shape[kMaxLoopDims] = {};
  int64_t strides[N][kMaxLoopDims] = {};

  bool is_contiguous() const {
    if (ndim > 1) return false;
    for (int k = 0; k < N; ++k)
      if (ndim == 1 && strides[k][0] != 1) return false;
    return true;
  }
};

}  // namespace strata
