// CPU kernels of the 3-d pools (max with indices, average, adaptive average and adaptive max,
// forward and backward) over contiguous (planes, D, H, W) volumes, planes = N * C. The window
// math is kernels/common/pool_window.h's, shared with kernels/cuda/pool3d.cu. Work is split by
// whole planes, so no two threads write one element; the backward passes accumulate each plane
// in compute_t<T> (float for the half types) and round once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "../common/half.h"
#include "../common/pool_window.h"
#include "parallel.h"

namespace strata::cpu {

using pool_math::Pool3dShape;

namespace pool3d_detail {

// Every output's taps along each dim, the average's per-dim scale factors, and along W the
// outputs [lo, hi) whose windows are whole (k taps from o * s - p), which the row loops below
// run tap by tap across the row, a loop without branches; the others run one at a time. Taps are
// visited in (d, h, w) order either way, so ties and NaNs pick as pool_math::window_max.
struct Tables {
  std::vector<pool_math::Taps> taps[3];
  std::vector<double> factor[3];
  int64_t lo = 0, hi = 0;
  double divisor_scale = 0;  // nonzero: 1 / divisor_override, replacing the factors

  Tables(const Pool3dShape& g, bool average) {
    for (int i = 0; i < 3; ++i)
      for (int64_t o = 0; o < g.dims[i].out; ++o) {
        double f = 1;
        taps[i].push_back(average ? pool_math::avg_dim(g, i, o, f)
                                  : pool_math::window_taps(g.dims[i], o, g.adaptive));
        factor[i].push_back(f);
      }
    if (average && !g.adaptive && g.divisor) divisor_scale = 1.0 / double(g.divisor);
    const pool_math::PoolDim& w = g.dims[2];
    if (g.adaptive) return;
    lo = std::min(w.out, (w.p + w.s - 1) / w.s);
    const int64_t dil = average ? 1 : w.dil;  // average windows are contiguous
    const int64_t span = w.in - 1 - (w.k - 1) * dil + w.p;  // o * s - p + (k - 1) dil <= in - 1
    hi = span < 0 ? lo : std::max(lo, std::min(w.out, span / w.s + 1));
    // max pooling numbers a whole window's taps in 32 bits, as wide as float values, so that
    // value and tap select together in one vector lane; larger windows run one at a time
    const int64_t pairs = std::min(g.dims[0].k, g.dims[0].in) * std::min(g.dims[1].k, g.dims[1].in);
    if (pairs * w.k >= (int64_t(1) << 31)) hi = lo;
  }

  double scale(int64_t o0, int64_t o1, int64_t o2) const {
    return divisor_scale ? divisor_scale
                         : factor[0][size_t(o0)] * factor[1][size_t(o1)] * factor[2][size_t(o2)];
  }
};

// Per-task scratch of the row loops: one value per output of a row, the winning tap's number
// (max pooling's whole windows) and the row offsets of the (d, h) tap pairs.
template <class C>
struct RowScratch {
  std::vector<C> v;
  std::vector<int32_t> tap;
  std::vector<int64_t> rows;
};

// Calls row(plane, o0, o1, output row offset, scratch) for every output row, a range of planes
// per task.
template <class C, class Row>
void for_each_row(const Pool3dShape& g, int64_t work_per_plane, const Row& row) {
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(work_per_plane, 1));
  parallel_for(0, g.planes, grain, [&](int64_t b, int64_t e) {
    RowScratch<C> scratch{std::vector<C>(size_t(g.dims[2].out)), std::vector<int32_t>(size_t(g.dims[2].out)), {}};
    for (int64_t r = b; r < e; ++r)
      for (int64_t o0 = 0; o0 < g.dims[0].out; ++o0)
        for (int64_t o1 = 0; o1 < g.dims[1].out; ++o1)
          row(r, o0, o1, ((r * g.dims[0].out + o0) * g.dims[1].out + o1) * g.dims[2].out, scratch);
  });
}

// Calls tap(row offset in the plane) for every (d, h) tap pair of output row (o0, o1).
template <class Tap>
void each_row_tap(const Tables& t, const Pool3dShape& g, int64_t o0, int64_t o1, const Tap& tap) {
  const pool_math::Taps& a = t.taps[0][size_t(o0)];
  const pool_math::Taps& b = t.taps[1][size_t(o1)];
  for (int64_t i = 0; i < a.count; ++i)
    for (int64_t j = 0; j < b.count; ++j)
      tap(((a.start + i * a.step) * g.dims[1].in + b.start + j * b.step) * g.dims[2].in);
}

inline int64_t work_per_plane(const Pool3dShape& g) {
  int64_t w = pool_math::in_volume(g) + pool_math::out_volume(g);
  for (const auto& d : g.dims) w *= g.adaptive ? (d.in + d.out - 1) / d.out + 1 : d.k;
  return w;
}

// gx's planes: zeroed, then scatter(plane, acc) adds into acc (compute_t<T>, one plane), rounded.
template <class T, class Scatter>
void by_plane(T* gx, const Pool3dShape& g, const Scatter& scatter) {
  using C = compute_t<T>;
  const int64_t iv = pool_math::in_volume(g);
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(work_per_plane(g), 1));
  parallel_for(0, g.planes, grain, [&](int64_t b, int64_t e) {
    std::vector<C> acc(static_cast<size_t>(iv));
    for (int64_t r = b; r < e; ++r) {
      std::fill(acc.begin(), acc.end(), C(0));
      scatter(r, acc.data());
      T* dst = gx + r * iv;
      for (int64_t i = 0; i < iv; ++i) dst[i] = T(acc[static_cast<size_t>(i)]);
    }
  });
}

}  // namespace pool3d_detail

/// Max pooling (g.adaptive false) or adaptive max pooling (true): y and indices (flat index
/// (d * H + h) * W + w of each window's maximum within its plane, as pool_math::window_max) of
/// shape (planes, oD, oH, oW).
template <class T>
void max_pool3d_forward(const T* x, T* y, int64_t* indices, const Pool3dShape& g) {
  using C = compute_t<T>;
  const pool3d_detail::Tables t(g, false);
  const int64_t iv = pool_math::in_volume(g), ow = g.dims[2].out;
  const int64_t s = g.dims[2].s, p = g.dims[2].p, k = g.dims[2].k, dil = g.dims[2].dil;
  pool3d_detail::for_each_row<C>(g, pool3d_detail::work_per_plane(g), [&](int64_t r, int64_t o0, int64_t o1,
                                                                            int64_t out, auto& scratch) {
    const T* plane = x + r * iv;
    int64_t* at = indices + out;
    C* __restrict best = scratch.v.data();
    int32_t* __restrict tap = scratch.tap.data();
    std::vector<int64_t>& rows = scratch.rows;
    rows.clear();
    pool3d_detail::each_row_tap(t, g, o0, o1, [&](int64_t row) { rows.push_back(row); });
    for (int64_t o2 = 0; o2 < ow; ++o2) {
      best[o2] = static_cast<C>(-HUGE_VAL);
      at[o2] = rows[0] + t.taps[2][size_t(o2)].start;
      tap[o2] = -1;
    }
    for (size_t j = 0; j < rows.size(); ++j) {
      const T* xr = plane + rows[j];
      for (int64_t o2 = 0; o2 < ow; ++o2) {
        if (o2 == t.lo) o2 = t.hi;  // the whole windows: below
        if (o2 >= ow) break;
        const pool_math::Taps& c = t.taps[2][size_t(o2)];
        for (int64_t l = c.start; l < c.start + c.count * c.step; l += c.step) {
          const C v = static_cast<C>(xr[l]);
          if (v > best[o2] || v != v) best[o2] = v, at[o2] = rows[j] + l;
        }
      }
      for (int64_t kx = 0; kx < k; ++kx) {
        const int64_t shift = kx * dil - p;
        const auto number = static_cast<int32_t>(int64_t(j) * k + kx);
        for (int64_t o2 = t.lo; o2 < t.hi; ++o2) {
          const C v = static_cast<C>(xr[o2 * s + shift]);
          const bool take = v > best[o2] || v != v;
          best[o2] = take ? v : best[o2];
          tap[o2] = take ? number : tap[o2];
        }
      }
    }
    for (int64_t o2 = t.lo; o2 < t.hi; ++o2)
      if (tap[o2] >= 0) at[o2] = rows[size_t(tap[o2] / k)] + o2 * s - p + tap[o2] % k * dil;
    for (int64_t o2 = 0; o2 < ow; ++o2) y[out + o2] = T(best[o2]);
  });
}

/// gx = gy scattered to the indices (of either max pooling). Raises std::out_of_range on an
/// index outside its plane (indices are not trusted).
template <class T>
void max_pool3d_backward(const T* gy, const int64_t* indices, T* gx, const Pool3dShape& g) {
  using C = compute_t<T>;
  const int64_t iv = pool_math::in_volume(g), ov = pool_math::out_volume(g);
  pool3d_detail::by_plane(gx, g, [&](int64_t r, C* acc) {
    for (int64_t o = r * ov; o < (r + 1) * ov; ++o) {
      const int64_t i = indices[o];
      if (i < 0 || i >= iv) throw std::out_of_range("max_pool3d_backward: index out of range");
      acc[i] += static_cast<C>(gy[o]);
    }
  });
}

/// Average pooling (g.adaptive false: g's window, padding rule and divisor) or adaptive average
/// pooling (true).
template <class T>
void avg_pool3d_forward(const T* x, T* y, const Pool3dShape& g) {
  using C = compute_t<T>;
  const pool3d_detail::Tables t(g, true);
  const int64_t iv = pool_math::in_volume(g), ow = g.dims[2].out, s = g.dims[2].s, p = g.dims[2].p, k = g.dims[2].k;
  pool3d_detail::for_each_row<C>(g, pool3d_detail::work_per_plane(g), [&](int64_t r, int64_t o0, int64_t o1,
                                                                            int64_t out, auto& scratch) {
    const T* plane = x + r * iv;
    C* sum = scratch.v.data();
    std::fill(sum, sum + ow, C(0));
    pool3d_detail::each_row_tap(t, g, o0, o1, [&](int64_t row) {
      const T* xr = plane + row;
      for (int64_t o2 = 0; o2 < ow; ++o2) {
        if (o2 == t.lo) o2 = t.hi;
        if (o2 >= ow) break;
        const pool_math::Taps& c = t.taps[2][size_t(o2)];
        for (int64_t l = c.start; l < c.start + c.count; ++l) sum[o2] += static_cast<C>(xr[l]);
      }
      C* __restrict acc = sum;
      for (int64_t kx = 0; kx < k; ++kx)
        for (int64_t o2 = t.lo; o2 < t.hi; ++o2) acc[o2] += static_cast<C>(xr[o2 * s + kx - p]);
    });
    for (int64_t o2 = 0; o2 < ow; ++o2) y[out + o2] = T(sum[o2] * static_cast<C>(t.scale(o0, o1, o2)));
  });
}

/// The gradient of an average pooling, one dim at a time: the scale 1 / divisor is a product of
/// per-dim factors (or one divisor_override), so the sum over the windows that hold an element
/// is W's sum, then H's, then D's, each a loop over contiguous rows (k per element and dim
/// rather than kD * kH * kW scattered adds).
template <class T>
void avg_pool3d_backward(const T* gy, T* gx, const Pool3dShape& g) {
  using C = compute_t<T>;
  const pool3d_detail::Tables t(g, true);
  const int64_t od = g.dims[0].out, oh = g.dims[1].out, ow = g.dims[2].out, H = g.dims[1].in, W = g.dims[2].in;
  auto factor = [&](int i, int64_t o) { return static_cast<C>(t.divisor_scale ? 1.0 : t.factor[i][size_t(o)]); };
  const C overall = static_cast<C>(t.divisor_scale ? t.divisor_scale : 1.0);
  pool3d_detail::by_plane(gx, g, [&](int64_t r, C* acc) {
    std::vector<C> along_w(size_t(od * oh * W), C(0)), along_h(size_t(od * H * W), C(0));
    const T* go = gy + r * od * oh * ow;
    for (int64_t row = 0; row < od * oh; ++row) {  // (oD, oH, oW) -> (oD, oH, W)
      C* dst = along_w.data() + row * W;
      for (int64_t o2 = 0; o2 < ow; ++o2) {
        const C v = static_cast<C>(go[row * ow + o2]) * factor(2, o2) * overall;
        const pool_math::Taps& c = t.taps[2][size_t(o2)];
        for (int64_t l = c.start; l < c.start + c.count; ++l) dst[l] += v;
      }
    }
    for (int64_t o0 = 0; o0 < od; ++o0)  // -> (oD, H, W)
      for (int64_t o1 = 0; o1 < oh; ++o1) {
        const C f = factor(1, o1);
        const pool_math::Taps& c = t.taps[1][size_t(o1)];
        const C* __restrict src = along_w.data() + (o0 * oh + o1) * W;
        for (int64_t h = c.start; h < c.start + c.count; ++h) {
          C* __restrict dst = along_h.data() + (o0 * H + h) * W;
          for (int64_t w = 0; w < W; ++w) dst[w] += src[w] * f;
        }
      }
    for (int64_t o0 = 0; o0 < od; ++o0) {  // -> (D, H, W)
      const C f = factor(0, o0);
      const pool_math::Taps& c = t.taps[0][size_t(o0)];
      const C* __restrict src = along_h.data() + o0 * H * W;
      for (int64_t d = c.start; d < c.start + c.count; ++d) {
        C* __restrict dst = acc + d * H * W;
        for (int64_t i = 0; i < H * W; ++i) dst[i] += src[i] * f;
      }
    }
  });
}

}  // namespace strata::cpu
