// Window math of the pooling kernels, one spatial dim at a time, shared by the CPU and CUDA
// kernels of the 2-d and 3-d pools (kernels/cpu/pool.h, kernels/cpu/pool3d.h,
// kernels/cuda/pool.cu, kernels/cuda/pool3d.cu), so every kernel sees the same windows,
// divisors, argmax order and NaN rule.
//
// A strided window of output o starts at o * stride - pad and has k taps dil apart; an adaptive
// window is [floor(o * in / out), ceil((o + 1) * in / out)).
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace strata::pool_math {

STRATA_HOST_DEVICE int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
STRATA_HOST_DEVICE int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

STRATA_HOST_DEVICE int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
STRATA_HOST_DEVICE int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

/// The taps t in [first, end) of a window starting at `start` (k taps, dil apart) that land
/// inside [0, size); first is not capped by k (an empty window keeps the position of its first
/// tap at or past 0, which max pooling's index starts from).
struct TapRange {
  int64_t first, end;
};

STRATA_HOST_DEVICE TapRange taps_inside(int64_t start, int64_t k, int64_t dil, int64_t size) {
  const int64_t first = start < 0 ? (-start + dil - 1) / dil : 0;
  const int64_t last = size - 1 - start;  // taps with start + t * dil <= size - 1
  const int64_t end = last < 0 ? 0 : min_i64(k, last / dil + 1);
  return {first, end};
}

/// The first output (stride s, padding p) whose window of extent `span` from its start contains
/// input position i: the smallest o >= 0 with o * s - p + span > i.
STRATA_HOST_DEVICE int64_t first_window(int64_t i, int64_t p, int64_t span, int64_t s) {
  const int64_t a = i + p - span + 1;
  return a <= 0 ? 0 : (a + s - 1) / s;
}

/// An average window along one dim: [begin, end) clipped to the input, and its length counting
/// the padding (clipped to in + pad, as PyTorch's count_include_pad divisor).
struct AvgSpan {
  int64_t begin, end, padded;
};

STRATA_HOST_DEVICE AvgSpan avg_span(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p) {
  const int64_t b = o * s - p, e = min_i64(b + k, in + p);
  return {max_i64(b, 0), min_i64(e, in), e - b};
}

/// The divisor of an average window of `inside` input elements and `padded` positions.
STRATA_HOST_DEVICE double avg_divisor(int64_t inside, int64_t padded, bool count_include_pad,
                                      int64_t divisor_override) {
  return divisor_override ? double(divisor_override) : count_include_pad ? double(padded) : double(inside);
}

/// A 2-d average window [h0, h1) x [w0, w1) clipped to the input, and 1 / its divisor, of output
/// (oy, ox) of a geometry G with the fields ih, iw, kh, kw, sh, sw, ph, pw (the CPU's and CUDA's
/// 2-d pooling shapes).
struct AvgWindow2d {
  int64_t h0, h1, w0, w1;
  double inv;
};

template <class G>
STRATA_HOST_DEVICE AvgWindow2d avg_window2d(const G& g, int64_t oy, int64_t ox, bool count_include_pad,
                                            int64_t divisor_override) {
  const AvgSpan h = avg_span(oy, g.ih, g.kh, g.sh, g.ph), w = avg_span(ox, g.iw, g.kw, g.sw, g.pw);
  const double d =
      avg_divisor((h.end - h.begin) * (w.end - w.begin), h.padded * w.padded, count_include_pad, divisor_override);
  return {h.begin, h.end, w.begin, w.end, 1.0 / d};
}

/// One dim of a window as the input positions start, start + step, ... (count of them).
struct Taps {
  int64_t start, step, count;
};

/// One spatial dim of a pooling: sizes and, for the strided pools, the window.
struct PoolDim {
  int64_t in = 0, out = 0, k = 1, s = 1, p = 0, dil = 1;
};

/// The input positions of output o's window along d: the taps inside the input (max pooling),
/// the clipped span (average pooling: dil 1), or the adaptive window.
STRATA_HOST_DEVICE Taps window_taps(const PoolDim& d, int64_t o, bool adaptive) {
  if (adaptive) {
    const int64_t b = adaptive_start(o, d.in, d.out);
    return {b, 1, adaptive_end(o, d.in, d.out) - b};
  }
  const int64_t start = o * d.s - d.p;
  const TapRange r = taps_inside(start, d.k, d.dil, d.in);
  return {start + r.first * d.dil, d.dil, max_i64(r.end - r.first, 0)};
}

/// Outputs [lo, hi) along d whose windows may hold input position i (a superset for dilated
/// windows: the caller checks window_holds).
struct OutRange {
  int64_t lo, hi;
};

STRATA_HOST_DEVICE OutRange outputs_holding(const PoolDim& d, int64_t i, bool adaptive) {
  if (adaptive) return {adaptive_start(i, d.out, d.in), min_i64(adaptive_end(i, d.out, d.in), d.out)};
  return {first_window(i, d.p, (d.k - 1) * d.dil + 1, d.s), min_i64(d.out, (i + d.p) / d.s + 1)};
}

STRATA_HOST_DEVICE bool window_holds(const Taps& t, int64_t i) {
  return i >= t.start && i < t.start + t.count * t.step && (i - t.start) % t.step == 0;
}

/// A 3-d pooling over contiguous (planes, D, H, W) volumes: dims[0..2] are D, H, W. adaptive:
/// adaptive windows (k, s, p, dil unused); divisor 0: no divisor_override.
struct Pool3dShape {
  int64_t planes = 0;
  PoolDim dims[3];
  bool adaptive = false, count_include_pad = true;
  int64_t divisor = 0;
};

STRATA_HOST_DEVICE int64_t in_volume(const Pool3dShape& g) { return g.dims[0].in * g.dims[1].in * g.dims[2].in; }
STRATA_HOST_DEVICE int64_t out_volume(const Pool3dShape& g) { return g.dims[0].out * g.dims[1].out * g.dims[2].out; }

/// The maximum of output (o0, o1, o2)'s window in one plane and its flat index (d * H + h) * W +
/// w, scanning d, then h, then w: the first of equal values wins and a NaN counts as the
/// maximum (a later NaN replaces an earlier one), as PyTorch's kernels; a window of -inf keeps
/// its first element.
template <class C, class T>
STRATA_HOST_DEVICE void window_max(const T* plane, const Pool3dShape& g, int64_t o0, int64_t o1, int64_t o2, C& best,
                                   int64_t& at) {
  const Taps t0 = window_taps(g.dims[0], o0, g.adaptive), t1 = window_taps(g.dims[1], o1, g.adaptive);
  const Taps t2 = window_taps(g.dims[2], o2, g.adaptive);
  const int64_t H = g.dims[1].in, W = g.dims[2].in;
  best = static_cast<C>(-HUGE_VAL);
  at = (t0.start * H + t1.start) * W + t2.start;
  for (int64_t a = 0; a < t0.count; ++a)
    for (int64_t b = 0; b < t1.count; ++b) {
      const int64_t row = ((t0.start + a * t0.step) * H + t1.start + b * t1.step) * W + t2.start;
      for (int64_t c = 0; c < t2.count; ++c) {
        const C v = static_cast<C>(plane[row + c * t2.step]);
        if (v > best || v != v) best = v, at = row + c * t2.step;
      }
    }
}

/// One dim of an average window: its taps (step 1) and its factor of the scale 1 / divisor. The
/// divisor is a product of one factor per dim (elements inside, or positions counting the
/// padding); a divisor_override replaces it whole (avg_scale).
STRATA_HOST_DEVICE Taps avg_dim(const Pool3dShape& g, int i, int64_t o, double& factor) {
  const PoolDim& d = g.dims[i];
  if (g.adaptive) {
    const Taps t = window_taps(d, o, true);
    factor = 1.0 / double(t.count);
    return t;
  }
  const AvgSpan sp = avg_span(o, d.in, d.k, d.s, d.p);
  const Taps t{sp.begin, 1, max_i64(sp.end - sp.begin, 0)};
  factor = 1.0 / double(g.count_include_pad ? sp.padded : t.count);
  return t;
}

/// 1 / the divisor of output (o0, o1, o2)'s average window, and its taps.
STRATA_HOST_DEVICE double avg_scale(const Pool3dShape& g, int64_t o0, int64_t o1, int64_t o2, Taps t[3]) {
  const int64_t o[3] = {o0, o1, o2};
  double scale = 1;
  for (int i = 0; i < 3; ++i) {
    double f;
    t[i] = avg_dim(g, i, o[i], f);
    scale *= f;
  }
  return !g.adaptive && g.divisor ? 1.0 / double(g.divisor) : scale;
}

/// The mean of output (o0, o1, o2)'s average window in one plane.
template <class C, class T>
STRATA_HOST_DEVICE C window_mean(const T* plane, const Pool3dShape& g, int64_t o0, int64_t o1, int64_t o2) {
  Taps t[3];
  const C scale = static_cast<C>(avg_scale(g, o0, o1, o2, t));
  const int64_t H = g.dims[1].in, W = g.dims[2].in;
  C sum = 0;
  for (int64_t a = t[0].start; a < t[0].start + t[0].count; ++a)
    for (int64_t b = t[1].start; b < t[1].start + t[1].count; ++b) {
      const T* row = plane + (a * H + b) * W;
      for (int64_t c = t[2].start; c < t[2].start + t[2].count; ++c) sum += static_cast<C>(row[c]);
    }
  return sum * scale;
}

}  // namespace strata::pool_math
