// LayerNorm and RMSNorm over the last n elements of a contiguous (rows, n) array, forward
// and backward. Statistics accumulate in math::acc_t<T> (double for float32), two passes per
// row (mean, then the centred variance), and are stored per row as S (the compute type) for
// the backward. The weight and bias gradients sum over rows in fixed blocks of rows, then
// over the blocks in order, so the result does not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../common/convert.h"
#include "../common/reduce_ops.h"
#include "parallel.h"

namespace strata::cpu {

inline constexpr int64_t kNormRowsPerBlock = 32;

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
      Acc m = 0;
      if (!rms) {
        for (int64_t j = 0; j < n; ++j) m += static_cast<Acc>(static_cast<C>(xr[j]));
        m /= static_cast<Acc>(n);
      }
      Acc v = 0;
      for (int64_t j = 0; j < n; ++j) {
        Acc d = static_cast<Acc>(static_cast<C>(xr[j])) - m;
        v += d * d;
      }
      v /= static_cast<Acc>(n);
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
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gr = g + r * n;
      const T* xr = x + r * n;
      T* out = gx + r * n;
      const C m = static_cast<C>(mean[r]), rs = static_cast<C>(rstd[r]);
      Acc sum_gh = 0, sum_ghx = 0;
      for (int64_t j = 0; j < n; ++j) {
        C gh = static_cast<C>(gr[j]) * (w ? static_cast<C>(w[j]) : C(1));
        C xh = (static_cast<C>(xr[j]) - m) * rs;
        sum_gh += static_cast<Acc>(gh);
        sum_ghx += static_cast<Acc>(gh * xh);
      }
      const C a = rms ? C(0) : static_cast<C>(sum_gh / static_cast<Acc>(n));
      const C c = static_cast<C>(sum_ghx / static_cast<Acc>(n));
      for (int64_t j = 0; j < n; ++j) {
        C gh = static_cast<C>(gr[j]) * (w ? static_cast<C>(w[j]) : C(1));
        C xh = (static_cast<C>(xr[j]) - m) * rs;
        out[j] = convert<T>(rs * (gh - a - xh * c));
      }
    }
  });
  if (!gw && !gb) return;
  // per-block partial sums over rows, then an ordered sum over blocks
  const int64_t blocks = (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
  std::vector<Acc> pw(gw ? static_cast<size_t>(blocks * n) : 0), pb(gb ? static_cast<size_t>(blocks * n) : 0);
  parallel_for(0, blocks, std::max<int64_t>(1, 8192 / std::max<int64_t>(n * kNormRowsPerBlock, 1)),
               [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      Acc* aw = gw ? pw.data() + blk * n : nullptr;
      Acc* ab = gb ? pb.data() + blk * n : nullptr;
      for (int64_t r = blk * kNormRowsPerBlock, re = std::min(rows, r + kNormRowsPerBlock); r < re; ++r) {
        const T* gr = g + r * n;
        const T* xr = x + r * n;
        const C m = static_cast<C>(mean[r]), rs = static_cast<C>(rstd[r]);
        if (aw)
          for (int64_t j = 0; j < n; ++j)
            aw[j] += static_cast<Acc>(static_cast<C>(gr[j]) * ((static_cast<C>(xr[j]) - m) * rs));
        if (ab)
          for (int64_t j = 0; j < n; ++j) ab[j] += static_cast<Acc>(static_cast<C>(gr[j]));
      }
    }
  });
  parallel_for(0, n, 1024, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      Acc sw = 0, sb = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        if (gw) sw += pw[static_cast<size_t>(blk * n + j)];
        if (gb) sb += pb[static_cast<size_t>(blk * n + j)];
      }
      if (gw) gw[j] = convert<T>(static_cast<C>(sw));
      if (gb) gb[j] = convert<T>(static_cast<C>(sb));
    }
  });
}

}  // namespace strata::cpu
