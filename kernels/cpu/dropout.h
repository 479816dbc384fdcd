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

namespace detail {

// Elements [4 * b0, 4 * b1) (whole blocks) and the first `tail` elements of block b1. The whole
// blocks run in a loop of its own with four lanes each, which gcc vectorizes across blocks,
// Philox included: 1.5 ns per element on one thread, where a lane count of min(4, n - i) kept it
// scalar at 3.7 (probe outside benchmarks/).
template <class T>
void dropout_blocks(const T* __restrict x, T* __restrict y, T* __restrict mask, int64_t b0, int64_t b1, int tail,
                    float p, compute_t<T> keep, uint64_t seed, uint64_t offset) {
  using C = compute_t<T>;
  auto lane = [&](const philox::Block& r, int64_t i, int l) {
    const C m = philox::dropout_factor(r.v[l], p, keep);
    mask[i] = convert<T>(m);
    y[i] = convert<T>(static_cast<C>(x[i]) * m);
  };
  for (int64_t blk = b0; blk < b1; ++blk) {
    const philox::Block r = philox::philox4x32_10(offset + static_cast<uint64_t>(blk), seed);
    for (int l = 0; l < 4; ++l) lane(r, blk * 4 + l, l);
  }
  if (tail > 0) {
    const philox::Block r = philox::philox4x32_10(offset + static_cast<uint64_t>(b1), seed);
    for (int l = 0; l < tail; ++l) lane(r, b1 * 4 + l, l);
  }
}

}  // namespace detail

template <class T>
void dropout(const T* x, T* y, T* mask, int64_t n, float p, double scale, uint64_t seed, uint64_t offset) {
  const int64_t whole = n / 4;
  const int tail = static_cast<int>(n % 4);
  const compute_t<T> keep = static_cast<compute_t<T>>(scale);
  parallel_for(0, whole + (tail > 0), 4096, [=](int64_t b0, int64_t b1) {
    const bool last = b1 > whole;  // the chunk that holds the partial block
    detail::dropout_blocks(x, y, mask, b0, last ? whole : b1, last ? tail : 0, p, keep, seed, offset);
  });
}

}  // namespace strata::cpu
