// 2-d pooling kernels on raw pointers: max (with argmax indices), average and adaptive
// average, forward and backward, for 4-d arrays indexed (n, c, h, w) with any element
// strides. Channels-last arrays (C stride 1 in input and output) run with the channel loop
// innermost, where it is contiguous; other layouts one (n, c) plane at a time.
//
// Backward kernels scatter into the input gradient, which they zero first. Threads split
// the work by whole planes (or whole images when channels-last), so no two write one
// element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "../common/half.h"
#include "../common/pool_window.h"
#include "parallel.h"

namespace strata::cpu {

struct Pool2dGeometry {
  int64_t n = 0, c = 0, ih = 0, iw = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

/// Element strides of a 4-d array, in (n, c, h, w) order.
struct Strides4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

namespace pool_detail {

// Calls body(n, c_begin, c_end, oy, ox) for every output position: all channels at once
// when channels_last, else one channel per call. Work is split by (n, oy) rows or (n, c)
// planes.
template <class Body>
void for_each_window(const Pool2dGeometry& g, bool channels_last, const Body& body) {
  if (channels_last) {
    const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(g.ow * g.c * g.kh * g.kw, 1));
    parallel_for(0, g.n * g.oh, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t ox = 0; ox < g.ow; ++ox) body(r / g.oh, 0, g.c, r % g.oh, ox);
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(g.oh * g.ow * g.kh * g.kw, 1));
  parallel_for(0, g.n * g.c, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) body(r / g.c, r % g.c, r % g.c + 1, oy, ox);
  });
}

// The backward counterpart: whole images when channels_last, else whole planes, so that
// overlapping windows of one plane are handled by one thread.
template <class Body>
void for_each_window_by_plane(const Pool2dGeometry& g, bool channels_last, const Body& body) {
  if (channels_last) {
    parallel_for(0, g.n, 1, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          for (int64_t ox = 0; ox < g.ow; ++ox) body(n, 0, g.c, oy, ox);
    });
    return;
  }
  for_each_window(g, false, body);
}

template <class T>
void zero_fill(T* x, const Strides4& s, const Pool2dGeometry& g) {
  parallel_for(0, g.n * g.c, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(g.ih * g.iw, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t r = b; r < e; ++r) {
                   T* p = x + (r / g.c) * s.n + (r % g.c) * s.c;
                   for (int64_t h = 0; h < g.ih; ++h)
                     for (int64_t w = 0; w < g.iw; ++w) p[h * s.h + w * s.w] = T(0.0f);
                 }
               });
}

using pool_math::avg_window2d;
using pool_math::adaptive_end;
using pool_math::adaptive_start;
using pool_math::TapRange;
using pool_math::taps_inside;

// max_pool2d_forward for planes with unit w strides (NCHW): one (n, c) plane per task. Each
// output row's interior (windows wholly inside the row) runs tap by tap across the row, a
// loop without branches the compiler vectorizes; the border windows run one at a time. Taps
// are visited in the same order (ky, then kx) either way, so ties and NaNs pick alike.
template <class T>
void max_pool2d_planes(const T* x, const Strides4& xs, T* y, int64_t* indices, const Strides4& ys,
                       const Pool2dGeometry& g) {
  using C = compute_t<T>;
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(g.oh * g.ow * g.kh * g.kw, 1));
  // outputs [lo, hi) of a row have every tap inside it
  const int64_t lo = std::min(g.ow, (g.pw + g.sw - 1) / g.sw);
  const int64_t span = g.iw - 1 - (g.kw - 1) * g.dw + g.pw;  // w0 + (kw - 1) dw <= iw - 1
  const int64_t hi = span < 0 ? lo : std::max(lo, std::min(g.ow, span / g.sw + 1));
  parallel_for(0, g.n * g.c, grain, [&](int64_t b, int64_t e) {
    std::vector<C> best(static_cast<size_t>(g.ow));
    std::vector<int64_t> at(static_cast<size_t>(g.ow));
    std::vector<int32_t> tap(static_cast<size_t>(g.ow));
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / g.c, c = r % g.c;
      const T* xp = x + n * xs.n + c * xs.c;
      T* yp = y + n * ys.n + c * ys.c;
      int64_t* ip = indices + n * ys.n + c * ys.c;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t h0 = oy * g.sh - g.ph;
        const TapRange ty = taps_inside(h0, g.kh, g.dh, g.ih);
        const int64_t first_row = (h0 + ty.first * g.dh) * g.iw;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t w0 = ox * g.sw - g.pw;
          const TapRange tx = taps_inside(w0, g.kw, g.dw, g.iw);
          best[ox] = -std::numeric_limits<C>::infinity();
          at[ox] = first_row + w0 + tx.first * g.dw;
          if (ox >= lo && ox < hi) continue;  // interior: below
          for (int64_t ky = ty.first; ky < ty.end; ++ky) {
            const int64_t h = h0 + ky * g.dh;
            for (int64_t kx = tx.first; kx < tx.end; ++kx) {
              const int64_t w = w0 + kx * g.dw;
              const C v = static_cast<C>(xp[h * xs.h + w]);
              if (v > best[ox] || std::isnan(v)) best[ox] = v, at[ox] = h * g.iw + w;
            }
          }
        }
        // the interior tracks the winning tap's number in 32 bits, as wide as the values, so
        // that value and tap select together in one vector lane: (ky - ty.first) * kw + kx,
        // below rows inside x kw <= ih * iw (max_pool2d_forward sends larger planes elsewhere)
        C* __restrict bp = best.data();
        int32_t* __restrict tp = tap.data();
        const int64_t sw = g.sw;  // a local: the stores below cannot change it
        for (int64_t ox = lo; ox < hi; ++ox) tp[ox] = -1;
        for (int64_t ky = ty.first; ky < ty.end; ++ky) {
          const T* __restrict row = xp + (h0 + ky * g.dh) * xs.h;
          for (int64_t kx = 0; kx < g.kw; ++kx) {
            const int64_t shift = kx * g.dw - g.pw;
            const int32_t t = static_cast<int32_t>((ky - ty.first) * g.kw + kx);
            for (int64_t ox = lo; ox < hi; ++ox) {
              const C v = static_cast<C>(row[ox * sw + shift]);
              const bool take = v > bp[ox] || v != v;
              bp[ox] = take ? v : bp[ox];
              tp[ox] = take ? t : tp[ox];
            }
          }
        }
        for (int64_t ox = lo; ox < hi; ++ox)
          if (tp[ox] >= 0)
            at[ox] = (h0 + (ty.first + tp[ox] / g.kw) * g.dh) * g.iw + ox * g.sw - g.pw + tp[ox] % g.kw * g.dw;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          yp[oy * ys.h + ox] = T(best[ox]);
          ip[oy * ys.h + ox] = at[ox];
        }
      }
    }
  });
}

}  // namespace pool_detail

/// y and indices share the strides ys; indices hold h * iw + w of each window's maximum
/// (NaN counts as the maximum, as in PyTorch).
template <class T>
void max_pool2d_forward(const T* x, const Strides4& xs, T* y, int64_t* indices, const Strides4& ys,
                        const Pool2dGeometry& g) {
  using C = compute_t<T>;
  const bool cl = xs.c == 1 && ys.c == 1;
  // planes whose tap numbers fit in 32 bits (pool_detail::max_pool2d_planes)
  const bool small_taps = std::min(g.kh, g.ih) * std::min(g.kw, g.iw) < (int64_t(1) << 31);
  if (!cl && xs.w == 1 && ys.w == 1 && small_taps) return pool_detail::max_pool2d_planes(x, xs, y, indices, ys, g);
  pool_detail::for_each_window(g, cl, [&](int64_t n, int64_t c0, int64_t c1, int64_t oy, int64_t ox) {
    const int64_t h0 = oy * g.sh - g.ph, w0 = ox * g.sw - g.pw;
    int64_t hs = h0, ws = w0;
    while (hs < 0) hs += g.dh;
    while (ws < 0) ws += g.dw;
    T* yo = y + n * ys.n + oy * ys.h + ox * ys.w;
    int64_t* io = indices + n * ys.n + oy * ys.h + ox * ys.w;
    for (int64_t c = c0; c < c1; ++c) {
      yo[c * ys.c] = T(-std::numeric_limits<C>::infinity());
      io[c * ys.c] = hs * g.iw + ws;
    }
    const T* xn = x + n * xs.n;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t h = h0 + ky * g.dh;
      if (h < 0 || h >= g.ih) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t w = w0 + kx * g.dw;
        if (w < 0 || w >= g.iw) continue;
        const T* xp = xn + h * xs.h + w * xs.w;
        const int64_t pos = h * g.iw + w;
        for (int64_t c = c0; c < c1; ++c) {
          const C v = static_cast<C>(xp[c * xs.c]);
          if (v > static_cast<C>(yo[c * ys.c]) || std::isnan(v)) {
            yo[c * ys.c] = xp[c * xs.c];
            io[c * ys.c] = pos;
          }
        }
      }
    }
  });
}

/// gx (zeroed here) += gy scattered to the argmax positions. Raises std::out_of_range on an
/// index outside the plane (indices are not trusted).
template <class T>
void max_pool2d_backward(const T* gy, const int64_t* indices, const Strides4& ys, T* gx, const Strides4& xs,
                         const Pool2dGeometry& g) {
  using C = compute_t<T>;
  pool_detail::zero_fill(gx, xs, g);
  const bool cl = xs.c == 1 && ys.c == 1;
  const int64_t plane = g.ih * g.iw;
  pool_detail::for_each_window_by_plane(g, cl, [&](int64_t n, int64_t c0, int64_t c1, int64_t oy, int64_t ox) {
    const int64_t o = n * ys.n + oy * ys.h + ox * ys.w;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i = indices[o + c * ys.c];
      if (i < 0 || i >= plane) throw std::out_of_range("max_pool2d_backward: index out of range");
      T& dst = gx[n * xs.n + c * xs.c + (i / g.iw) * xs.h + (i % g.iw) * xs.w];
      dst = T(static_cast<C>(dst) + static_cast<C>(gy[o + c * ys.c]));
    }
  });
}

template <class T>
void avg_pool2d_forward(const T* x, const Strides4& xs, T* y, const Strides4& ys, const Pool2dGeometry& g,
                        bool count_include_pad, int64_t divisor_override) {
  using C = compute_t<T>;
  const bool cl = xs.c == 1 && ys.c == 1;
  pool_detail::for_each_window(g, cl, [&](int64_t n, int64_t c0, int64_t c1, int64_t oy, int64_t ox) {
    const auto win = pool_detail::avg_window2d(g, oy, ox, count_include_pad, divisor_override);
    const C inv = static_cast<C>(win.inv);
    T* yo = y + n * ys.n + oy * ys.h + ox * ys.w;
    const T* xn = x + n * xs.n;
    for (int64_t c = c0; c < c1; ++c) {
      C s = 0;
      for (int64_t h = win.h0; h < win.h1; ++h)
        for (int64_t w = win.w0; w < win.w1; ++w) s += static_cast<C>(xn[c * xs.c + h * xs.h + w * xs.w]);
      yo[c * ys.c] = T(s * inv);
    }
  });
}

template <class T>
void avg_pool2d_backward(const T* gy, const Strides4& ys, T* gx, const Strides4& xs, const Pool2dGeometry& g,
                         bool count_include_pad, int64_t divisor_override) {
  using C = compute_t<T>;
  pool_detail::zero_fill(gx, xs, g);
  const bool cl = xs.c == 1 && ys.c == 1;
  pool_detail::for_each_window_by_plane(g, cl, [&](int64_t n, int64_t c0, int64_t c1, int64_t oy, int64_t ox) {
    const auto win = pool_detail::avg_window2d(g, oy, ox, count_include_pad, divisor_override);
    const C inv = static_cast<C>(win.inv);
    const T* go = gy + n * ys.n + oy * ys.h + ox * ys.w;
    T* xn = gx + n * xs.n;
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w)
        for (int64_t c = c0; c < c1; ++c) {
          T& dst = xn[c * xs.c + h * xs.h + w * xs.w];
          dst = T(static_cast<C>(dst) + static_cast<C>(go[c * ys.c]) * inv);
        }
  });
}

template <class T>
void adaptive_avg_pool2d_forward(const T* x, const Strides4& xs, T* y, const Strides4& ys, const Pool2dGeometry& g) {
  using C = compute_t<T>;
  const bool cl = xs.c == 1 && ys.c == 1;
  pool_detail::for_each_window(g, cl, [&](int64_t n, int64_t c0, int64_t c1, int64_t oy, int64_t ox) {
    const int64_t h0 = pool_detail::adaptive_start(oy, g.ih, g.oh), h1 = pool_detail::adaptive_end(oy, g.ih, g.oh);
    const int64_t w0 = pool_detail::adaptive_start(ox, g.iw, g.ow), w1 = pool_detail::adaptive_end(ox, g.iw, g.ow);
    const C inv = static_cast<C>(1.0 / double((h1 - h0) * (w1 - w0)));
    T* yo = y + n * ys.n + oy * ys.h + ox * ys.w;
    const T* xn = x + n * xs.n;
    for (int64_t c = c0; c < c1; ++c) {
      C s = 0;
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) s += static_cast<C>(xn[c * xs.c + h * xs.h + w * xs.w]);
      yo[c * ys.c] = T(s * inv);
    }
  });
}

template <class T>
void adaptive_avg_pool2d_backward(const T* gy, const Strides4& ys, T* gx, const Strides4& xs,
                                  const Pool2dGeometry& g) {
  using C = compute_t<T>;
  pool_detail::zero_fill(gx, xs, g);
  const bool cl = xs.c == 1 && ys.c == 1;
  pool_detail::for_each_window_by_plane(g, cl, [&](int64_t n, int64_t c0, int64_t c1, int64_t oy, int64_t ox) {
    const int64_t h0 = pool_detail::adaptive_start(oy, g.ih, g.oh), h1 = pool_detail::adaptive_end(oy, g.ih, g.oh);
    const int64_t w0 = pool_detail::adaptive_start(ox, g.iw, g.ow), w1 = pool_detail::adaptive_end(ox, g.iw, g.ow);
    const C inv = static_cast<C>(1.0 / double((h1 - h0) * (w1 - w0)));
    const T* go = gy + n * ys.n + oy * ys.h + ox * ys.w;
    T* xn = gx + n * xs.n;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w)
        for (int64_t c = c0; c < c1; ++c) {
          T& dst = xn[c * xs.c + h * xs.h + w * xs.w];
          dst = T(static_cast<C>(dst) + static_cast<C>(go[c * ys.c]) * inv);
        }
  });
}

}  // namespace strata::cpu
