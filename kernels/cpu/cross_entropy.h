// Fused softmax cross-entropy over the rows of contiguous (rows, classes) logits with class
// indices, forward and backward (the math is in kernels/common/cross_entropy_math.h).
// The forward reads each row once from memory, online in blocks of kCrossEntropyBlock
// logits: a block's maximum, then (re-reading the block from L1) its exps, with the running
// sums rescaled when the maximum grows; with label smoothing the weighted sum of the logits
// rides along. Each step runs in kCrossEntropyLanes independent accumulators, so it
// vectorizes, and merges them in a fixed order, so the result does not depend on the thread
// count. (Per block rather than per element as on the GPU, Note [Online logsumexp]: the
// per-element rescale costs more vector work than a second read from L1.) The backward
// writes each gradient element from its logit and the saved logsumexp, in one pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../common/convert.h"
#include "../common/cross_entropy_math.h"
#include "parallel.h"
#include "reduce.h"

namespace strata::cpu {

// Rows per thread chunk: about this many logits (exp dominates the cost).
inline constexpr int64_t kCrossEntropyGrain = 4096;
// Accumulators per row: 16 floats are two AVX2 vectors per quantity, few enough that every
// accumulator and the exp constants stay in registers.
inline constexpr int kCrossEntropyLanes = 16;
inline constexpr int64_t kCrossEntropyBlock = 512;  // logits per block: 2 KiB of float, in L1

namespace detail {

// The logsumexp of a row and, when Smooth, sum_j w_j (x_j - shift) (w_j = 1 unless
// Weighted).
template <class T, bool Smooth, bool Weighted>
void ce_row_stats(const T* x, const T* w, int64_t c, compute_t<T> shift, math::OnlineLse<compute_t<T>>& lse,
                  math::acc_t<T>& wx) {
  using C = compute_t<T>;
  constexpr int L = kCrossEntropyLanes;
  C m = math::lse_start<C>().max, sum[L], ws[L], bm[L];
  for (int l = 0; l < L; ++l) sum[l] = ws[l] = C(0);
  for (int64_t b0 = 0; b0 < c; b0 += kCrossEntropyBlock) {
    const int64_t b1 = std::min(c, b0 + kCrossEntropyBlock);
    // the block's maximum (a NaN is skipped here and poisons the sums below)
    for (int l = 0; l < L; ++l) bm[l] = m;
    int64_t i = b0;
    for (; i + L <= b1; i += L) {
#pragma GCC unroll 1  // see Note [Lane loops] in reduce.h
      for (int l = 0; l < L; ++l) bm[l] = static_cast<C>(x[i + l]) > bm[l] ? static_cast<C>(x[i + l]) : bm[l];
    }
    for (int l = 0; i + l < b1; ++l) bm[l] = static_cast<C>(x[i + l]) > bm[l] ? static_cast<C>(x[i + l]) : bm[l];
    C nm = bm[0];
    for (int l = 1; l < L; ++l) nm = bm[l] > nm ? bm[l] : nm;
    if (nm > m) {
      const C f = math::ce_exp(m - nm);
      for (int l = 0; l < L; ++l) sum[l] *= f;
      m = nm;
    }
    auto fold = [&](int l, int64_t j) {
      const C v = static_cast<C>(x[j]);
      sum[l] += math::ce_exp(v - m);
      if constexpr (Smooth) ws[l] += (Weighted ? static_cast<C>(w[j]) : C(1)) * (v - shift);
    };
    for (i = b0; i + L <= b1; i += L) {
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) fold(l, i + l);
    }
    for (int l = 0; i + l < b1; ++l) fold(l, i + l);
  }
  for (int h = L / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) {
      sum[l] += sum[l + h];
      ws[l] += ws[l + h];
    }
  lse = {m, sum[0]};
  wx = static_cast<math::acc_t<T>>(ws[0]);
}

}  // namespace detail

/// loss[r] = cross entropy of row r of x (rows, c) at class target[r] (0 when target[r] is
/// ignore_index, NaN when it is out of range), lse[r] = logsumexp of the row. w (c) holds the
/// class weights or is null; total_weight is their sum (unused without weights); eps is the
/// label smoothing. c >= 1.
template <class T>
void cross_entropy_forward(const T* x, const int64_t* target, const T* w, T* loss, compute_t<T>* lse, int64_t rows,
                           int64_t c, int64_t ignore_index, double eps, double total_weight) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  const bool smooth = eps > 0;
  const Acc total_w = w ? static_cast<Acc>(total_weight) : static_cast<Acc>(c);
  parallel_for(0, rows, std::max<int64_t>(1, kCrossEntropyGrain / c), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * c;
      const C shift = math::ce_shift(static_cast<C>(xr[0]));
      math::OnlineLse<C> st;
      Acc wx = 0;
      if (!smooth) detail::ce_row_stats<T, false, false>(xr, w, c, shift, st, wx);
      else if (w) detail::ce_row_stats<T, true, true>(xr, w, c, shift, st, wx);
      else detail::ce_row_stats<T, true, false>(xr, w, c, shift, st, wx);
      const Acc l = static_cast<Acc>(st.max) + std::log(static_cast<Acc>(st.sum));
      lse[r] = static_cast<compute_t<T>>(l);
      const int64_t t = target[r];
      Acc out = 0;
      if (t != ignore_index) {
        if (!math::ce_in_range(t, c)) {
          out = static_cast<Acc>(NAN);
        } else {
          const Acc w_t = w ? static_cast<Acc>(static_cast<C>(w[t])) : Acc(1);
          out = math::ce_row_loss<Acc>(l, static_cast<Acc>(static_cast<C>(xr[t])), w_t, wx, static_cast<Acc>(shift),
                                       total_w, static_cast<Acc>(eps), c);
        }
      }
      loss[r] = convert<T>(static_cast<C>(out));
    }
  });
}

/// gx (rows, c) = gradient of the row losses for output gradients g[r * g_stride] (g_stride
/// 0 broadcasts one value), from the logits x and the lse the forward saved.
template <class T>
void cross_entropy_backward(const T* g, int64_t g_stride, const T* x, const int64_t* target, const compute_t<T>* lse,
                            const T* w, T* gx, int64_t rows, int64_t c, int64_t ignore_index, double eps,
                            double total_weight) {
  using C = compute_t<T>;
  const C total_w = w ? static_cast<C>(total_weight) : static_cast<C>(c);
  parallel_for(0, rows, std::max<int64_t>(1, kCrossEntropyGrain / std::max<int64_t>(c, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * c;
      T* out = gx + r * c;
      const int64_t t = target[r];
      if (t != ignore_index && !math::ce_in_range(t, c)) {
        std::fill(out, out + c, convert<T>(static_cast<C>(NAN)));
        continue;
      }
      const bool valid = t != ignore_index;
      const C w_t = valid && w ? static_cast<C>(w[t]) : C(1);
      const auto row = math::ce_grad_row<C>(static_cast<C>(g[r * g_stride]), valid, w_t, total_w, static_cast<C>(eps), c);
      const C l = static_cast<C>(lse[r]);
      if (w) {
        for (int64_t j = 0; j < c; ++j)
          out[j] = convert<T>(math::ce_grad(row, static_cast<C>(xr[j]), l, static_cast<C>(w[j]), false));
      } else {
        for (int64_t j = 0; j < c; ++j) out[j] = convert<T>(math::ce_grad(row, static_cast<C>(xr[j]), l, C(1), false));
      }
      if (valid) out[t] = convert<T>(math::ce_grad(row, static_cast<C>(xr[t]), l, w ? static_cast<C>(w[t]) : C(1), true));
    }
  });
}

}  // namespace strata::cpu
