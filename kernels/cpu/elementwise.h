// The one CPU driver for elementwise kernels: out[i] = f(in0[i], in1[i], ...) over a
// StridedLoop. A contiguous loop runs as a flat loop the compiler vectorizes; otherwise the
// innermost dim is a tight loop and the outer dims advance like an odometer.
//
// Note [Loops out of line]
// Both loops are functions of their own that are never inlined, so f is inlined into a small
// function and the loop vectorizes however it is reached. When parallel_for runs one chunk (one
// thread, or a small tensor) it calls the loop in place, inside the large functions that
// dispatch over dtypes; inlined there, gcc ran out of inlining budget and called f once per
// element: tanh, erf and both GELUs and their gradients ran 10-30x slower on one thread than
// per thread on two (12.3 against 0.9 ns per element for the tanh GELU).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "../common/strided_loop.h"
#include "parallel.h"

namespace strata::cpu {

namespace detail {

// out[i] = f(in[i]...) for i in [begin, end) of contiguous operands.
template <class Out, class F, class... In>
__attribute__((noinline)) void run_flat(int64_t begin, int64_t end, Out* __restrict out, const F& f,
                                        const In*... in) {
  for (int64_t i = begin; i < end; ++i) out[i] = f(in[i]...);
}

template <class Out, class F, class... In, size_t... I>
__attribute__((noinline)) void run_range(const StridedLoop<1 + sizeof...(In)>& loop, int64_t begin, int64_t end,
                                         Out* out, std::index_sequence<I...>, const F& f, const In*... in) {
  constexpr int N = 1 + sizeof...(In);
  int64_t idx[kMaxLoopDims];
  std::array<int64_t, N> off{};
  int64_t rem = begin;
  for (int d = 0; d < loop.ndim; ++d) {
    idx[d] = rem % loop.shape[d];
    rem /= loop.shape[d];
    for (int k = 0; k < N; ++k) off[k] += idx[d] * loop.strides[k][d];
  }
  const int64_t inner = loop.ndim > 0 ? loop.shape[0] : 1;
  std::array<int64_t, N> s0{};
  bool unit = true, unit_or_broadcast = true;
  for (int k = 0; k < N; ++k) {
    s0[k] = loop.ndim > 0 ? loop.strides[k][0] : 0;
    if (s0[k] != 1) unit = false;
    if (s0[k] != 1 && (k == 0 || s0[k] != 0)) unit_or_broadcast = false;
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t i0 = loop.ndim > 0 ? idx[0] : 0;
    int64_t n = std::min(inner - i0, end - pos);
    Out* o = out + off[0];
    if (unit) {
      for (int64_t j = 0; j < n; ++j) o[j] = f(in[off[I + 1] + j]...);
    } else if (unit_or_broadcast) {
      for (int64_t j = 0; j < n; ++j) o[j] = f(in[off[I + 1] + (s0[I + 1] ? j : 0)]...);
    } else {
      for (int64_t j = 0; j < n; ++j) o[j * s0[0]] = f(in[off[I + 1] + j * s0[I + 1]]...);
    }
    pos += n;
    if (pos >= end) break;
    // advance the odometer past the finished inner row
    for (int k = 0; k < N; ++k) off[k] += n * s0[k];
    if (loop.ndim > 0) idx[0] += n;
    for (int d = 0; d < loop.ndim && idx[d] == loop.shape[d]; ++d) {
      idx[d] = 0;
      for (int k = 0; k < N; ++k) off[k] -= loop.shape[d] * loop.strides[k][d];
      if (d + 1 < loop.ndim) {
        ++idx[d + 1];
        for (int k = 0; k < N; ++k) off[k] += loop.strides[k][d + 1];
      }
    }
  }
}

// out[i] = fast(in[i]) on blocks of contiguous values that all satisfy fast_ok, slow(in[i]) on
// the rest: the check is a vectorized scan, so the blocks cost no branch per element.
template <class Out, class In, class Fast, class Slow, class Ok>
__attribute__((noinline)) void run_flat_guarded(int64_t begin, int64_t end, Out* __restrict out, const In* in,
                                                const Fast& fast, const Slow& slow, const Ok& fast_ok) {
  constexpr int64_t kBlock = 512;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t e = std::min(b + kBlock, end);
    int rejected = 0;  // an int, not a bool: the vectorizer reduces |= of ints only
    for (int64_t i = b; i < e; ++i) rejected |= !fast_ok(in[i]);
    if (!rejected) {
      for (int64_t i = b; i < e; ++i) out[i] = fast(in[i]);
    } else {
      for (int64_t i = b; i < e; ++i) out[i] = slow(in[i]);
    }
  }
}

}  // namespace detail

/// Applies f elementwise. `f` takes one value per input and returns the output value.
template <class Out, class F, class... In>
void elementwise(const StridedLoop<1 + sizeof...(In)>& loop, Out* out, const F& f, const In*... in) {
  if (loop.numel == 0) return;
  if (loop.is_contiguous()) {
    parallel_for(0, loop.numel, kDefaultGrain, [&](int64_t b, int64_t e) { detail::run_flat(b, e, out, f, in...); });
    return;
  }
  parallel_for(0, loop.numel, kDefaultGrain, [&](int64_t b, int64_t e) {
    detail::run_range(loop, b, e, out, std::index_sequence_for<In...>{}, f, in...);
  });
}

/// One input, out[i] = fast(in[i]) where fast_ok(in[i]) holds, else slow(in[i]), for a fast form
/// that is exact only on part of the domain (the vectorized sine below 2^20, say).
template <class Out, class In, class Fast, class Slow, class Ok>
void elementwise_guarded(const StridedLoop<2>& loop, Out* out, const Fast& fast, const Slow& slow, const Ok& fast_ok,
                         const In* in) {
  if (loop.numel == 0) return;
  if (loop.is_contiguous()) {
    parallel_for(0, loop.numel, kDefaultGrain,
                 [&](int64_t b, int64_t e) { detail::run_flat_guarded(b, e, out, in, fast, slow, fast_ok); });
    return;
  }
  elementwise(loop, out, [&](In v) { return fast_ok(v) ? fast(v) : slow(v); }, in);
}

}  // namespace strata::cpu
