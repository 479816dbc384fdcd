// Softmax and log-softmax along one dim of a contiguous (outer, n, inner) array. Each row is
// shifted by its maximum before exp, so large inputs stay finite. When the dim is innermost a
// row is a contiguous run; otherwise blocks of up to kSoftmaxCols columns are processed
// together, vectorised across columns. The result does not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/convert.h"
#include "../common/reduce_ops.h"
#include "../common/softmax_math.h"
#include "../common/vec_exp.h"
#include "parallel.h"
#include "reduce.h"

namespace strata::cpu {

inline constexpr int64_t kSoftmaxCols = 128;
// exp costs far more than an add: split rows across threads at a smaller grain than
// elementwise kernels.
inline constexpr int64_t kSoftmaxGrain = 4096;

namespace detail {

// Storing exp(x - max) and scaling it in place is exact enough in float and double; in the
// 16-bit types the exp is recomputed rather than rounded twice.
template <class T> inline constexpr bool kStoreExp = std::is_floating_point_v<T>;

// Note [Float softmax rows]
// A float32 row (the logits of a classifier, an attention row) in four passes over the row,
// which sits in L1: its maximum as in Note [Extreme runs], exp(x - max) written to y, their
// sum in float lanes (sum_float_blocks), then y scaled, or rewritten as x - max - log(sum).
// One pass that also summed in double lanes kept those lanes in memory and converted every
// exp to double: 0.95x LibTorch's softmax along rows of 1000.

// A float run's sum as a float32 sum along a row forms it: float lanes per block of
// kFloatSumLanes * kReduceLaneRows (Note [Float lanes]), the blocks added in double.
inline double sum_float_blocks(const float* p, int64_t n) {
  constexpr int64_t block = kFloatSumLanes * kReduceLaneRows;
  double sum = 0;
  for (int64_t b = 0; b < n; b += block) sum += sum_float_run(p + b, std::min(block, n - b));
  return sum;
}

inline void softmax_row_float(const float* x, float* y, int64_t n, bool log) {
  const RunExtreme<float> r = run_extreme<true, float>(x, n);
  const float mx = r.has_nan ? NAN : r.value;
  for (int64_t j = 0; j < n; ++j) y[j] = math::vec_exp(x[j] - mx);
  const double sum = sum_float_blocks(y, n);
  if (log) {
    const float lse = static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - mx - lse;
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
}

template <class T>
void softmax_row(const T* x, T* y, int64_t n, bool log) {
  if constexpr (std::is_same_v<T, float>) {
    // run_extreme reads a whole lane width; log_softmax reads x after y is written
    if (n >= kReduceLanes && (!log || x != y)) return softmax_row_float(x, y, n, log);
  }
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  C lane[kReduceLanes];
  for (auto& v : lane) v = math::lowest<C>();
  int64_t i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes) {
#pragma GCC unroll 1  // see Note [Lane loops] in reduce.h
    for (int l = 0; l < kReduceLanes; ++l) lane[l] = math::max_nan(lane[l], static_cast<C>(x[i + l]));
  }
  for (int l = 0; l < kReduceLanes && i + l < n; ++l) lane[l] = math::max_nan(lane[l], static_cast<C>(x[i + l]));
  for (int w = kReduceLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] = math::max_nan(lane[l], lane[l + w]);
  const C mx = lane[0];
  // the sum of exps, in kReduceLanes accumulators so that it vectorises
  Acc part[kReduceLanes] = {};
  const bool store = kStoreExp<T> && !log;
  for (i = 0; i + kReduceLanes <= n; i += kReduceLanes) {
    if (store) {
#pragma GCC unroll 1
      for (int l = 0; l < kReduceLanes; ++l) {
        C e = math::vec_exp(static_cast<C>(x[i + l]) - mx);
        y[i + l] = static_cast<T>(e);
        part[l] += e;
      }
    } else {
#pragma GCC unroll 1
      for (int l = 0; l < kReduceLanes; ++l) part[l] += math::vec_exp(static_cast<C>(x[i + l]) - mx);
    }
  }
  for (int l = 0; l < kReduceLanes && i + l < n; ++l) {
    C e = math::vec_exp(static_cast<C>(x[i + l]) - mx);
    if (store) y[i + l] = static_cast<T>(e);
    part[l] += e;
  }
  for (int w = kReduceLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) part[l] += part[l + w];
  const Acc sum = part[0];
  if (log) {
    C lse = static_cast<C>(std::log(sum));
    for (int64_t j = 0; j < n; ++j) y[j] = convert<T>(static_cast<C>(x[j]) - mx - lse);
  } else if constexpr (kStoreExp<T>) {
    C inv = static_cast<C>(Acc(1) / sum);
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  } else {
    C inv = static_cast<C>(Acc(1) / sum);
    for (int64_t j = 0; j < n; ++j) y[j] = convert<T>(math::vec_exp(static_cast<C>(x[j]) - mx) * inv);
  }
}

// Columns [0, cw) of an (n, inner) block starting at x / y.
template <class T>
void softmax_cols(const T* x, T* y, int64_t n, int64_t inner, int64_t cw, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  C mx[kSoftmaxCols], fin[kSoftmaxCols];
  Acc sum[kSoftmaxCols];
  for (int64_t j = 0; j < cw; ++j) {
    mx[j] = math::lowest<C>();
    sum[j] = 0;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cw; ++j) mx[j] = math::max_nan(mx[j], static_cast<C>(x[i * inner + j]));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < cw; ++j) {
      C e = math::vec_exp(static_cast<C>(x[i * inner + j]) - mx[j]);
      if (kStoreExp<T> && !log) y[i * inner + j] = e;
      sum[j] += e;
    }
  }
  for (int64_t j = 0; j < cw; ++j)
    fin[j] = log ? static_cast<C>(std::log(sum[j])) : static_cast<C>(Acc(1) / sum[j]);
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * inner;
    T* yr = y + i * inner;
    if (log) {
      for (int64_t j = 0; j < cw; ++j) yr[j] = convert<T>(static_cast<C>(xr[j]) - mx[j] - fin[j]);
    } else if constexpr (kStoreExp<T>) {
      for (int64_t j = 0; j < cw; ++j) yr[j] *= fin[j];
    } else {
      for (int64_t j = 0; j < cw; ++j) yr[j] = convert<T>(math::vec_exp(static_cast<C>(xr[j]) - mx[j]) * fin[j]);
    }
  }
}

// The gradient of a float32 row as in Note [Float softmax rows]: the terms of the row's total
// (g y, or g for log_softmax) summed in float lanes, the products first written to dx.
inline void softmax_backward_row_float(const float* y, const float* g, float* dx, int64_t n, bool log) {
  const float* terms = g;
  if (!log) {
    for (int64_t j = 0; j < n; ++j) dx[j] = math::softmax_grad_term(y[j], g[j], false);
    terms = dx;
  }
  const double total = sum_float_blocks(terms, n);
  if (log) {
    for (int64_t j = 0; j < n; ++j) dx[j] = math::log_softmax_grad(y[j], g[j], total);
  } else {
    for (int64_t j = 0; j < n; ++j) dx[j] = math::softmax_grad(y[j], g[j], total);
  }
}

// The gradient of one contiguous row (see kernels/common/softmax_math.h), the row's sum in
// kReduceLanes accumulators so that it vectorises.
template <class T>
void softmax_backward_row(const T* y, const T* g, T* dx, int64_t n, bool log) {
  if constexpr (std::is_same_v<T, float>) {
    if (dx != y && dx != g) return softmax_backward_row_float(y, g, dx, n, log);  // dx holds terms first
  }
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  Acc part[kReduceLanes] = {};
  int64_t i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes) {
#pragma GCC unroll 1  // see Note [Lane loops] in reduce.h
    for (int l = 0; l < kReduceLanes; ++l)
      part[l] += math::softmax_grad_term(static_cast<C>(y[i + l]), static_cast<C>(g[i + l]), log);
  }
  for (int l = 0; l < kReduceLanes && i + l < n; ++l)
    part[l] += math::softmax_grad_term(static_cast<C>(y[i + l]), static_cast<C>(g[i + l]), log);
  for (int w = kReduceLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) part[l] += part[l + w];
  const Acc total = part[0];
  if (log) {
    for (int64_t j = 0; j < n; ++j)
      dx[j] = convert<T>(math::log_softmax_grad(static_cast<C>(y[j]), static_cast<C>(g[j]), total));
  } else {
    for (int64_t j = 0; j < n; ++j)
      dx[j] = convert<T>(math::softmax_grad(static_cast<C>(y[j]), static_cast<C>(g[j]), total));
  }
}

// Columns [0, cw) of an (n, inner) block.
template <class T>
void softmax_backward_cols(const T* y, const T* g, T* dx, int64_t n, int64_t inner, int64_t cw, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  Acc total[kSoftmaxCols] = {};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cw; ++j)
      total[j] += math::softmax_grad_term(static_cast<C>(y[i * inner + j]), static_cast<C>(g[i * inner + j]), log);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cw; ++j) {
      const int64_t k = i * inner + j;
      const C yv = static_cast<C>(y[k]), gv = static_cast<C>(g[k]);
      dx[k] = convert<T>(log ? math::log_softmax_grad(yv, gv, total[j]) : math::softmax_grad(yv, gv, total[j]));
    }
}

// Runs row(o, offset) over the rows of (outer, n, 1), or block(o, j0, cw, offset) over
// blocks of up to kSoftmaxCols columns of (outer, n, inner), in parallel.
template <class Row, class Block>
void for_each_softmax_slice(int64_t outer, int64_t n, int64_t inner, const Row& row, const Block& block) {
  if (inner == 1) {
    parallel_for(0, outer, std::max<int64_t>(1, kSoftmaxGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) row(o, o * n);
    });
    return;
  }
  const int64_t nchunk = (inner + kSoftmaxCols - 1) / kSoftmaxCols;
  const int64_t work = n * std::min(inner, kSoftmaxCols);
  parallel_for(0, outer * nchunk, std::max<int64_t>(1, kSoftmaxGrain / work), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nchunk, j0 = (t % nchunk) * kSoftmaxCols;
      block(o * n * inner + j0, std::min(kSoftmaxCols, inner - j0));
    }
  });
}

}  // namespace detail

/// y = softmax(x) (or log_softmax when `log`) along the middle dim of (outer, n, inner). With
/// causal_rows = L > 0 (inner must be 1), row o keeps its first o % L + 1 elements and the
/// rest are masked out (0, or -inf for log_softmax): a causal mask on (L, n) matrices.
template <class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log, int64_t causal_rows = 0) {
  if (outer == 0 || n == 0 || inner == 0) return;
  const T masked = log ? convert<T>(-INFINITY) : T(0);
  detail::for_each_softmax_slice(
      outer, n, inner,
      [&](int64_t o, int64_t off) {
        const int64_t keep = math::causal_row_length(o, causal_rows, n);
        detail::softmax_row(x + off, y + off, keep, log);
        std::fill(y + off + keep, y + off + n, masked);
      },
      [&](int64_t off, int64_t cw) { detail::softmax_cols(x + off, y + off, n, inner, cw, log); });
}

/// dx from y = softmax(x) (or log_softmax when `log`) and the gradient g in y, along the
/// middle dim of (outer, n, inner). A causal softmax's masked elements (y = 0) get dx = 0.
template <class T>
void softmax_backward(const T* y, const T* g, T* dx, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (outer == 0 || n == 0 || inner == 0) return;
  detail::for_each_softmax_slice(
      outer, n, inner, [&](int64_t, int64_t off) { detail::softmax_backward_row(y + off, g + off, dx + off, n, log); },
      [&](int64_t off, int64_t cw) { detail::softmax_backward_cols(y + off, g + off, dx + off, n, inner, cw, log); });
}

}  // namespace strata::cpu
