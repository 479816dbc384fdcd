// CPU loops for indexed reads and writes along one dim: gather (also index_select), scatter
// and scatter-add (also index_add), and the min/max scan that validates an index tensor
// before anything is written. Index values are trusted here; callers validate them first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>

#include "../common/binary_math.h"
#include "../common/convert.h"
#include "parallel.h"
#include "strided_rows.h"

namespace strata::cpu {

namespace detail {

// The contiguous rows of the two paths that profit from them, out of line so that gcc
// vectorizes them (Note [Loops out of line] in elementwise.h): out[j] = x[idx[j] * stride]
// (gather along the innermost dim, by vector gathers where the CPU has them), and a whole
// row of self taking a row of src (index_add's and embedding's backward). self and src never
// overlap: the callers copy a src that shares self's storage first.
template <class T, class I>
__attribute__((noinline)) void gather_row(T* __restrict out, const T* __restrict x, const I* __restrict idx,
                                          int64_t n, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) out[j] = x[static_cast<int64_t>(idx[j]) * stride];
}

// dst + alpha * v, integers wrapping around (math::Add and Mul) rather than overflowing.
template <class C>
inline C add_scaled(C dst, C alpha, C v) {
  return math::Add{}(dst, math::Mul{}(alpha, v));
}

template <bool Add, class T>
__attribute__((noinline)) void scatter_row(T* __restrict dst, const T* __restrict src, int64_t n,
                                           compute_t<T> alpha) {
  using C = compute_t<T>;
  if constexpr (!Add) {
    std::copy(src, src + n, dst);
  } else if constexpr (std::is_same_v<T, bool>) {
    for (int64_t j = 0; j < n; ++j) dst[j] = dst[j] || (alpha && src[j]);
  } else {
    for (int64_t j = 0; j < n; ++j)
      dst[j] = static_cast<T>(add_scaled(static_cast<C>(dst[j]), alpha, static_cast<C>(src[j])));
  }
}

// The range of a contiguous run of index values, folded into lo and hi; local accumulators
// let gcc keep them in vector registers (it had walked the runs element by element, as long
// as the gather it validates).
template <class I>
__attribute__((noinline)) void min_max_row(const I* __restrict p, int64_t n, int64_t& lo, int64_t& hi) {
  int64_t l = lo, h = hi;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t v = static_cast<int64_t>(p[j]);
    l = v < l ? v : l;
    h = v > h ? v : h;
  }
  lo = l;
  hi = h;
}

}  // namespace detail

/// Smallest and largest value of an index tensor walked by `loop` (one operand).
template <class I>
void index_min_max(const StridedLoop<1>& loop, const I* idx, int64_t& lo, int64_t& hi) {
  lo = std::numeric_limits<int64_t>::max();
  hi = std::numeric_limits<int64_t>::min();
  std::mutex m;
  parallel_for(0, loop.numel, kDefaultGrain, [&](int64_t b, int64_t e) {
    int64_t l = std::numeric_limits<int64_t>::max(), h = std::numeric_limits<int64_t>::min();
    for_each_row(loop, b, e, [&](const auto& off, int64_t n, const auto& step) {
      const I* p = idx + off[0];
      if (step[0] == 1) {
        detail::min_max_row(p, n, l, h);
        return;
      }
      for (int64_t j = 0; j < n; ++j) {
        int64_t v = static_cast<int64_t>(p[j * step[0]]);
        l = std::min(l, v);
        h = std::max(h, v);
      }
    });
    std::lock_guard<std::mutex> g(m);
    lo = std::min(lo, l);
    hi = std::max(hi, h);
  });
}

/// out[p] = x[xoff(p) + idx[p] * x_dim_stride] over a loop with operands (out, x, idx), where
/// x's stride along the indexed dim is 0 in the loop and applied through the index instead.
template <class T, class I>
void gather(const StridedLoop<3>& loop, T* out, const T* x, const I* idx, int64_t x_dim_stride) {
  parallel_for(0, loop.numel, kDefaultGrain, [&](int64_t b, int64_t e) {
    for_each_row(loop, b, e, [&](const auto& off, int64_t n, const auto& step) {
      T* o = out + off[0];
      const T* xs = x + off[1];
      const I* ix = idx + off[2];
      if (step[2] == 0) {  // one index for the whole row (index_select): a strided copy
        const T* row = xs + static_cast<int64_t>(*ix) * x_dim_stride;
        if (step[0] == 1 && step[1] == 1) {
          std::copy(row, row + n, o);
        } else {
          for (int64_t j = 0; j < n; ++j) o[j * step[0]] = row[j * step[1]];
        }
      } else if (step[0] == 1 && step[1] == 0 && step[2] == 1) {  // gather along the row's own dim
        detail::gather_row(o, xs, ix, n, x_dim_stride);
      } else {
        for (int64_t j = 0; j < n; ++j)
          o[j * step[0]] = xs[j * step[1] + static_cast<int64_t>(ix[j * step[2]]) * x_dim_stride];
      }
    });
  });
}

/// The strides along the indexed dim of the three operands of a scatter.
struct ScatterDim {
  int64_t size;  // the index's extent along the dim
  int64_t self, index, src;
  bool dim_inner;  // true when the dim is walked innermost (it is the faster one in memory)
};

/// self[soff(p) + idx[p] * d.self] = src[p] (Add: += alpha * src[p]) over `outer`, a loop with
/// operands (self, idx, src) whose indexed dim has size 1; d describes that dim. Threads split
/// the outer positions, so no two threads reach the same element of self, and each element's
/// updates land in increasing order along the dim: the result is deterministic.
template <bool Add, class T, class I>
void scatter(const StridedLoop<3>& outer, const ScatterDim& d, T* self, const I* idx, const T* src,
             compute_t<T> alpha) {
  using C = compute_t<T>;
  auto put = [alpha](T& dst, T v) {
    if constexpr (Add) {
      if constexpr (std::is_same_v<T, bool>) dst = dst || (alpha && v);
      else dst = static_cast<T>(detail::add_scaled(static_cast<C>(dst), alpha, static_cast<C>(v)));
    } else {
      dst = v;
    }
  };
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(d.size, 1));
  parallel_for(0, outer.numel, grain, [&](int64_t b, int64_t e) {
    if (d.dim_inner) {
      for_each_row(outer, b, e, [&](const auto& off, int64_t n, const auto& step) {
        for (int64_t r = 0; r < n; ++r) {
          T* s = self + off[0] + r * step[0];
          const I* ix = idx + off[1] + r * step[1];
          const T* v = src + off[2] + r * step[2];
          for (int64_t j = 0; j < d.size; ++j)
            put(s[static_cast<int64_t>(ix[j * d.index]) * d.self], v[j * d.src]);
        }
      });
    } else {
      // along the dim outermost, so rows of the other dims stream through memory
      for (int64_t j = 0; j < d.size; ++j) {
        for_each_row(outer, b, e, [&](const auto& off, int64_t n, const auto& step) {
          T* s = self + off[0];
          const I* ix = idx + off[1] + j * d.index;
          const T* v = src + off[2] + j * d.src;
          if (step[1] == 0 && step[0] == 1 && step[2] == 1) {  // one index for the row (index_add)
            detail::scatter_row<Add>(s + static_cast<int64_t>(*ix) * d.self, v, n, alpha);
          } else {
            for (int64_t r = 0; r < n; ++r)
              put(s[r * step[0] + static_cast<int64_t>(ix[r * step[1]]) * d.self], v[r * step[2]]);
          }
        });
      }
    }
  });
}

}  // namespace strata::cpu
