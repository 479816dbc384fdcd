// CPU loops for sort and topk along one dim. Each slice is copied into (value, position)
// pairs, ordered, and written out. The order puts NaN above every number (so NaNs come last
// ascending and first descending, as in PyTorch) and breaks ties by position, which makes
// sort stable and topk deterministic on ties.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/convert.h"
#include "parallel.h"
#include "strided_rows.h"

namespace strata::cpu {

/// a < b, with NaN greater than everything and equal to itself.
template <class C>
inline bool less_nan_last(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

/// One slice per outer position: operands (x, values, indices) of `outer`; along the dim the
/// slice has `n` elements at strides x_stride, v_stride, i_stride.
struct SliceDim {
  int64_t n;
  int64_t x_stride, v_stride, i_stride;
};

/// Orders each slice of x and writes its first `k` entries (k = n for a full sort).
/// descending = true puts the largest first.
template <class T>
void sort_slices(const StridedLoop<3>& outer, const SliceDim& d, int64_t k, bool descending, const T* x, T* values,
                 int64_t* indices) {
  using C = compute_t<T>;
  using P = std::pair<C, int64_t>;
  auto before = [descending](const P& a, const P& b) {
    if (descending ? less_nan_last(b.first, a.first) : less_nan_last(a.first, b.first)) return true;
    if (descending ? less_nan_last(a.first, b.first) : less_nan_last(b.first, a.first)) return false;
    return a.second < b.second;
  };
  // slices are independent; one thread sorts whole slices
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(d.n, 1));
  parallel_for(0, outer.numel, grain, [&](int64_t b, int64_t e) {
    std::vector<P> buf(static_cast<size_t>(d.n));
    for_each_row(outer, b, e, [&](const auto& off, int64_t rows, const auto& step) {
      for (int64_t r = 0; r < rows; ++r) {
        const T* xs = x + off[0] + r * step[0];
        for (int64_t j = 0; j < d.n; ++j) buf[j] = P(static_cast<C>(xs[j * d.x_stride]), j);
        if (k == d.n) std::sort(buf.begin(), buf.end(), before);
        else std::partial_sort(buf.begin(), buf.begin() + k, buf.end(), before);
        T* vs = values + off[1] + r * step[1];
        int64_t* is = indices + off[2] + r * step[2];
        for (int64_t j = 0; j < k; ++j) {
          vs[j * d.v_stride] = static_cast<T>(buf[j].first);
          is[j * d.i_stride] = buf[j].second;
        }
      }
    });
  });
}

}  // namespace strata::cpu
