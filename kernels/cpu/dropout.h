// Dropout in one pass over a contiguous array: element i is kept when the Philox uniform of
// element i of the draw (Note [Random stream layout] in kernels/common/philox.h) is at least
// p. Writes y = x * mask and the mask itself, holding 0 or 1 / (1 - p), which is all the
// backward needs.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../common/convert.h"
#include "../common/philox.h"
#include "parallel.h"

namespace strata::cpu {

template <class T>
void dropout(const T* x, T* y, T* mask, int64_t n, float p, double scale, uint64_t seed, uint64_t offset) {
  using C = compute_t<T>;
  const int64_t blocks = (n + 3) / 4;
  parallel_for(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      philox::Block r = philox::philox4x32_10(offset + static_cast<uint64_t>(blk), seed);
      const int64_t i0 = blk * 4, len = std::min<int64_t>(4, n - i0);
      for (int64_t l = 0; l < len; ++l) {
        const C m = philox::to_unit_float(r.v[l]) >= p ? static_cast<C>(scale) : C(0);
        mask[i0 + l] = convert<T>(m);
        y[i0 + l] = convert<T>(static_cast<C>(x[i0 + l]) * m);
      }
    }
  });
}

}  // namespace strata::cpu
