// Inclusive scans (running sum or product) along one dim of a contiguous (outer, n, inner)
// array, accumulating in math::acc_t<T>. When the dim is not innermost, whole rows of up to
// kScanCols columns advance together, vectorised across columns.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../common/convert.h"
#include "../common/reduce_ops.h"
#include "parallel.h"

namespace strata::cpu {

inline constexpr int64_t kScanCols = 256;

/// y[.., i, ..] = x[.., 0, ..] op ... op x[.., i, ..] with op = + (or * when IsProd).
template <bool IsProd, class T>
void scan(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  using Acc = math::acc_t<T>;
  auto step = [](Acc a, T v) {
    Acc b = static_cast<Acc>(static_cast<compute_t<T>>(v));
    return IsProd ? math::wrapping_mul(a, b) : math::wrapping_add(a, b);
  };
  const Acc identity = IsProd ? Acc(1) : Acc(0);
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    parallel_for(0, outer, std::max<int64_t>(1, kDefaultGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        Acc acc = identity;
        for (int64_t i = 0; i < n; ++i) {
          acc = step(acc, x[o * n + i]);
          y[o * n + i] = convert<T>(acc);
        }
      }
    });
    return;
  }
  const int64_t nchunk = (inner + kScanCols - 1) / kScanCols;
  const int64_t work = n * std::min(inner, kScanCols);
  parallel_for(0, outer * nchunk, std::max<int64_t>(1, kDefaultGrain / work), [&](int64_t b, int64_t e) {
    Acc acc[kScanCols];
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / nchunk, j0 = (t % nchunk) * kScanCols, cw = std::min(kScanCols, inner - j0);
      for (int64_t j = 0; j < cw; ++j) acc[j] = identity;
      for (int64_t i = 0; i < n; ++i) {
        int64_t off = (o * n + i) * inner + j0;
        for (int64_t j = 0; j < cw; ++j) {
          acc[j] = step(acc[j], x[off + j]);
          y[off + j] = convert<T>(acc[j]);
        }
      }
    }
  });
}

}  // namespace strata::cpu
