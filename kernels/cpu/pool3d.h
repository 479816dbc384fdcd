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

// Calls body(plane, o0, o1, o2, flat output index) for every output, a range of planes per task.
template <class Body>
void for_each_output(const Pool3dShape& g, int64_t window, const Body& body) {
  const int64_t ov = pool_math::out_volume(g);
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(ov * window, 1));
  parallel_for(0, g.planes, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t o = r * ov;
      for (int64_t o0 = 0; o0 < g.dims[0].out; ++o0)
        for (int64_t o1 = 0; o1 < g.dims[1].out; ++o1)
          for (int64_t o2 = 0; o2 < g.dims[2].out; ++o2) body(r, o0, o1, o2, o++);
    }
  });
}

// A rough window size for the grain: the product of the kernel (or adaptive window) sizes.
inline int64_t window_size(const Pool3dShape& g) {
  int64_t w = 1;
  for (const auto& d : g.dims) w *= g.adaptive ? (d.in + d.out - 1) / d.out + 1 : d.k;
  return w;
}

// gx's planes: zeroed, then scatter(plane, acc) adds into acc (compute_t<T>, one plane), rounded.
template <class T, class Scatter>
void by_plane(T* gx, const Pool3dShape& g, const Scatter& scatter) {
  using C = compute_t<T>;
  const int64_t iv = pool_math::in_volume(g), ov = pool_math::out_volume(g);
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(iv + ov * window_size(g), 1));
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
/// (d * H + h) * W + w of each window's maximum within its plane) of shape (planes, oD, oH, oW).
template <class T>
void max_pool3d_forward(const T* x, T* y, int64_t* indices, const Pool3dShape& g) {
  using C = compute_t<T>;
  const int64_t iv = pool_math::in_volume(g);
  pool3d_detail::for_each_output(g, pool3d_detail::window_size(g),
                                 [&](int64_t r, int64_t o0, int64_t o1, int64_t o2, int64_t o) {
                                   C best;
                                   pool_math::window_max(x + r * iv, g, o0, o1, o2, best, indices[o]);
                                   y[o] = T(best);
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
  const int64_t iv = pool_math::in_volume(g);
  pool3d_detail::for_each_output(g, pool3d_detail::window_size(g),
                                 [&](int64_t r, int64_t o0, int64_t o1, int64_t o2, int64_t o) {
                                   y[o] = T(pool_math::window_mean<C>(x + r * iv, g, o0, o1, o2));
                                 });
}

template <class T>
void avg_pool3d_backward(const T* gy, T* gx, const Pool3dShape& g) {
  using C = compute_t<T>;
  const int64_t ov = pool_math::out_volume(g);
  const int64_t H = g.dims[1].in, W = g.dims[2].in;
  pool3d_detail::by_plane(gx, g, [&](int64_t r, C* acc) {
    int64_t o = r * ov;
    for (int64_t o0 = 0; o0 < g.dims[0].out; ++o0)
      for (int64_t o1 = 0; o1 < g.dims[1].out; ++o1)
        for (int64_t o2 = 0; o2 < g.dims[2].out; ++o2, ++o) {
          pool_math::Taps t[3];
          const C v = static_cast<C>(gy[o]) * static_cast<C>(pool_math::avg_scale(g, o0, o1, o2, t));
          for (int64_t a = t[0].start; a < t[0].start + t[0].count; ++a)
            for (int64_t b = t[1].start; b < t[1].start + t[1].count; ++b) {
              C* row = acc + (a * H + b) * W;
              for (int64_t c = t[2].start; c < t[2].start + t[2].count; ++c) row[c] += v;
            }
        }
  });
}

}  // namespace strata::cpu
