// LayerNorm and RMSNorm over the last n elements of a contiguous (rows, n) array, forward
// and backward. Statistics accumulate in math::acc_t<T> (double for float32) and are stored
// per row as S (the compute type) for the backward. Row sums run in kNormLanes independent
// accumulators combined in a fixed order, so they compile to SIMD without reassociating
// (Note [Reduce loops] in reduce.h); for float32 the mean and variance come from one pass
// (the sums of x and x^2, in double). The weight and bias gradients sum over rows in fixed
// blocks of rows, then over the blocks in order, so the result does not depend on the
// thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "../common/convert.h"
#include "../common/reduce_ops.h"
#include "parallel.h"

namespace strata::cpu {

inline constexpr int64_t kNormRowsPerBlock = 32;
inline constexpr int kNormLanes = 16;

// The sums of f(j) and of g(j) over j in [0, n), in one pass: each into kNormLanes Acc
// lanes (lane l takes j = l mod kNormLanes), combined pairwise at the end.
template <class Acc, class F, class G>
inline std::pair<Acc, Acc> lane_sums(int64_t n, F f, G g) {
  Acc pf[kNormLanes] = {}, pg[kNormLanes] = {};
  int64_t j = 0;
  for (; j + kNormLanes <= n; j += kNormLanes) {
#pragma GCC unroll 1  // see Note [Lane loops] in reduce.h
    for (int l = 0; l < kNormLanes; ++l) {
      pf[l] += static_cast<Acc>(f(j + l));
      pg[l] += static_cast<Acc>(g(j + l));
    }
  }
  for (int l = 0; j + l < n; ++l) {
    pf[l] += static_cast<Acc>(f(j + l));
    pg[l] += static_cast<Acc>(g(j + l));
  }
  for (int w = kNormLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) pf[l] += pf[l + w], pg[l] += pg[l + w];
  return {pf[0], pg[0]};
}

// Mean and variance of a row: from the sums of x and x^2 in one pass when Acc is wider
// than the data (float32 in double: the cancellation in E[x^2] - mean^2 costs nothing
// visible), else from two passes (mean, then the centred squares). rms: the mean is 0.
template <class T>
inline std::pair<math::acc_t<T>, math::acc_t<T>> row_moments(const T* x, int64_t n, bool rms) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  auto val = [x](int64_t j) { return static_cast<Acc>(static_cast<C>(x[j])); };
  const Acc inv_n = Acc(1) / static_cast<Acc>(n);
  if constexpr (sizeof(Acc) > sizeof(C)) {
    auto [s, ss] = lane_sums<Acc>(n, val, [&](int64_t j) { return val(j) * val(j); });
    const Acc m = rms ? Acc(0) : s * inv_n;
    const Acc v = ss * inv_n - m * m;
    return {m, v > Acc(0) ? v : Acc(0)};
  } else {
    const Acc m = rms ? Acc(0) : lane_sums<Acc>(n, val, [](int64_t) { return Acc(0); }).first * inv_n;
    auto sq = [&](int64_t j) { return (val(j) - m) * (val(j) - m); };
    return {m, lane_sums<Acc>(n, sq, [](int64_t) { return Acc(0); }).first * inv_n};
  }
}

/// y = (x - mean) * rstd * w + b per row (rms: y = x * rstd * w, with rstd from mean(x^2)).
/// w and b may be null. mean and rstd receive one value per row (mean is 0 for rms).
template <class T, class S>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, S* mean, S* rstd, int64_t rows, int64_t n,
                        double eps, bool rms) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      const auto [m, v] = row_moments(xr, n, rms);
      const Acc rs = Acc(1) / std::sqrt(v + static_cast<Acc>(eps));
      mean[r] = static_cast<S>(m);
      rstd[r] = static_cast<S>(rs);
      const C cm = static_cast<C>(m), cr = static_cast<C>(rs);
      if (w && b) {
        for (int64_t j = 0; j < n; ++j)
          yr[j] = convert<T>((static_cast<C>(xr[j]) - cm) * cr * static_cast<C>(w[j]) + static_cast<C>(b[j]));
      } else if (w) {
        for (int64_t j = 0; j < n; ++j) yr[j] = convert<T>((static_cast<C>(xr[j]) - cm) * cr * static_cast<C>(w[j]));
      } else if (b) {
        for (int64_t j = 0; j < n; ++j) yr[j] = convert<T>((static_cast<C>(xr[j]) - cm) * cr + static_cast<C>(b[j]));
      } else {
        for (int64_t j = 0; j < n; ++j) yr[j] = convert<T>((static_cast<C>(xr[j]) - cm) * cr);
      }
    }
  });
}

/// Gradients of layer_norm_forward given the output gradient g: gx (always), gw and gb (when
/// not null). With xhat = (x - mean) * rstd and gh = g * w:
///   gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))   (rms: no mean(gh) term)
///   gw = sum over rows of g * xhat,  gb = sum over rows of g.
template <class T, class S>
void layer_norm_backward(const T* g, const T* x, const S* mean, const S* rstd, const T* w, T* gx, T* gw, T* gb,
                         int64_t rows, int64_t n, bool rms) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  // Rows go in fixed blocks; each block writes gx for its rows and, while the rows are in
  // cache, its partial sums of gw and gb over its 32 rows (in C: few terms), which are then
  // added in block order in Acc.
  const int64_t blocks = (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
  thread_local std::vector<C> partial;  // grows only: no fresh pages on every call
  partial.resize(std::max(partial.size(), static_cast<size_t>(blocks * n * ((gw ? 1 : 0) + (gb ? 1 : 0)))));
  C* const pw = gw ? partial.data() : nullptr;
  C* const pb = gb ? partial.data() + (gw ? blocks * n : 0) : nullptr;
  parallel_for(0, blocks, std::max<int64_t>(1, 16384 / std::max<int64_t>(n * kNormRowsPerBlock, 1)),
               [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      C* aw = pw ? pw + blk * n : nullptr;
      C* ab = pb ? pb + blk * n : nullptr;
      if (aw) std::fill(aw, aw + n, C(0));
      if (ab) std::fill(ab, ab + n, C(0));
      for (int64_t r = blk * kNormRowsPerBlock, re = std::min(rows, r + kNormRowsPerBlock); r < re; ++r) {
        const T* gr = g + r * n;
        const T* xr = x + r * n;
        T* out = gx + r * n;
        const C m = static_cast<C>(mean[r]), rs = static_cast<C>(rstd[r]);
        auto xh = [xr, m, rs](int64_t j) { return (static_cast<C>(xr[j]) - m) * rs; };
        auto row = [&](auto gh) {  // gh(j) = g * w, chosen outside the loops
          const auto [sum_gh, sum_ghx] = lane_sums<Acc>(n, gh, [&](int64_t j) { return gh(j) * xh(j); });
          const C a = rms ? C(0) : static_cast<C>(sum_gh / static_cast<Acc>(n));
          const C c = static_cast<C>(sum_ghx / static_cast<Acc>(n));
          for (int64_t j = 0; j < n; ++j) out[j] = convert<T>(rs * (gh(j) - a - xh(j) * c));
        };
        if (w) row([gr, w](int64_t j) { return static_cast<C>(gr[j]) * static_cast<C>(w[j]); });
        else row([gr](int64_t j) { return static_cast<C>(gr[j]); });
        if (aw)
          for (int64_t j = 0; j < n; ++j) aw[j] += static_cast<C>(gr[j]) * xh(j);
        if (ab)
          for (int64_t j = 0; j < n; ++j) ab[j] += static_cast<C>(gr[j]);
      }
    }
  });
  if (!gw && !gb) return;
  parallel_for(0, n, 1024, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      Acc sw = 0, sb = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        if (pw) sw += pw[blk * n + j];
        if (pb) sb += pb[blk * n + j];
      }
      if (gw) gw[j] = convert<T>(static_cast<C>(sw));
      if (gb) gb[j] = convert<T>(static_cast<C>(sb));
    }
  });
}

}  // namespace strata::cpu
