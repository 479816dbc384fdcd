// CUDA pooling kernels: max (with argmax indices), average and adaptive average, forward and
// backward, on 4-d arrays with any element strides (entry points in nn_ops.h).
//
// Forward: one thread per output element. Backward: one thread per input-gradient element,
// which gathers the output gradients of the windows that contain it, so every element is
// written once, without atomics and without a zero fill, and the sums do not depend on
// thread scheduling. Threads walk the elements in the memory order of the array they write
// (channel innermost for channels-last data, as the CPU kernels split the work), so
// neighbouring threads touch neighbouring addresses. Flat indices are 32-bit when the count
// allows; element offsets are always 64-bit.
#include <cmath>
#include <cstdint>

#include "../common/half.h"
#include "../common/pool_window.h"
#include "grid_stride.cuh"
#include "nn_ops.h"

namespace strata::cuda_kernels {

namespace {

constexpr int kPoolThreads = 256;

struct Pos {
  int64_t n, c, h, w;
};

// Flat index -> (n, c, h, w) over (C, H, W) planes; channel innermost when channels_last.
template <class I>
__device__ __forceinline__ Pos decode(I i, I C, I H, I W, bool channels_last) {
  Pos p;
  if (channels_last) {
    p.c = static_cast<int64_t>(i % C), i /= C;
    p.w = static_cast<int64_t>(i % W), i /= W;
    p.h = static_cast<int64_t>(i % H), p.n = static_cast<int64_t>(i / H);
  } else {
    p.w = static_cast<int64_t>(i % W), i /= W;
    p.h = static_cast<int64_t>(i % H), i /= H;
    p.c = static_cast<int64_t>(i % C), p.n = static_cast<int64_t>(i / C);
  }
  return p;
}

template <class I>
__device__ __forceinline__ I first_index() { return static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; }
template <class I>
__device__ __forceinline__ I grid_step() { return static_cast<I>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

using pool_math::adaptive_end;
using pool_math::adaptive_start;
using pool_math::first_window;

// ---- max pooling ------------------------------------------------------------------------------

template <class T, class I>
__global__ void max_pool_forward_kernel(I total, Pool2dShape g, const T* __restrict__ x, Strides4 xs,
                                        T* __restrict__ y, int64_t* __restrict__ indices, Strides4 ys, bool cl) {
  using C = compute_t<T>;
  for (I i = first_index<I>(); i < total; i += grid_step<I>()) {
    const Pos o = decode<I>(i, I(g.c), I(g.oh), I(g.ow), cl);
    const int64_t h0 = o.h * g.sh - g.ph, w0 = o.w * g.sw - g.pw;
    // the first in-range tap, the index reported when no element beats -inf (as the CPU)
    const int64_t hs = h0 < 0 ? h0 + (-h0 + g.dh - 1) / g.dh * g.dh : h0;
    const int64_t ws = w0 < 0 ? w0 + (-w0 + g.dw - 1) / g.dw * g.dw : w0;
    C best = C(-INFINITY);
    int64_t best_pos = hs * g.iw + ws;
    const T* xp = x + o.n * xs.n + o.c * xs.c;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t h = h0 + ky * g.dh;
      if (h < 0 || h >= g.ih) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t w = w0 + kx * g.dw;
        if (w < 0 || w >= g.iw) continue;
        const C v = static_cast<C>(xp[h * xs.h + w * xs.w]);
        if (v > best || v != v) {  // NaN is the maximum; a later NaN replaces an earlier one, as on the CPU
          best = v;
          best_pos = h * g.iw + w;
        }
      }
    }
    const int64_t off = o.n * ys.n + o.c * ys.c + o.h * ys.h + o.w * ys.w;
    y[off] = T(best);
    indices[off] = best_pos;
  }
}

template <class T, class I>
__global__ void max_pool_backward_kernel(I total, Pool2dShape g, const T* __restrict__ gy,
                                         const int64_t* __restrict__ indices, Strides4 ys, T* __restrict__ gx,
                                         Strides4 xs, bool cl) {
  using C = compute_t<T>;
  for (I i = first_index<I>(); i < total; i += grid_step<I>()) {
    const Pos p = decode<I>(i, I(g.c), I(g.ih), I(g.iw), cl);
    const int64_t oy0 = first_window(p.h, g.ph, (g.kh - 1) * g.dh + 1, g.sh);
    const int64_t ox0 = first_window(p.w, g.pw, (g.kw - 1) * g.dw + 1, g.sw);
    const int64_t oy1 = min64(g.oh, (p.h + g.ph) / g.sh + 1), ox1 = min64(g.ow, (p.w + g.pw) / g.sw + 1);
    const int64_t target = p.h * g.iw + p.w;
    const int64_t base = p.n * ys.n + p.c * ys.c;
    C acc = C(0);
    for (int64_t oy = oy0; oy < oy1; ++oy)
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        const int64_t o = base + oy * ys.h + ox * ys.w;
        if (indices[o] == target) acc += static_cast<C>(gy[o]);
      }
    gx[p.n * xs.n + p.c * xs.c + p.h * xs.h + p.w * xs.w] = T(acc);
  }
}

// ---- average pooling --------------------------------------------------------------------------

using pool_math::avg_window2d;

template <class T, class I>
__global__ void avg_pool_forward_kernel(I total, Pool2dShape g, const T* __restrict__ x, Strides4 xs,
                                        T* __restrict__ y, Strides4 ys, bool cl, bool count_include_pad,
                                        int64_t divisor_override) {
  using C = compute_t<T>;
  for (I i = first_index<I>(); i < total; i += grid_step<I>()) {
    const Pos o = decode<I>(i, I(g.c), I(g.oh), I(g.ow), cl);
    const pool_math::AvgWindow2d win = avg_window2d(g, o.h, o.w, count_include_pad, divisor_override);
    const T* xp = x + o.n * xs.n + o.c * xs.c;
    C s = C(0);
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) s += static_cast<C>(xp[h * xs.h + w * xs.w]);
    y[o.n * ys.n + o.c * ys.c + o.h * ys.h + o.w * ys.w] = T(s * static_cast<C>(win.inv));
  }
}

template <class T, class I>
__global__ void avg_pool_backward_kernel(I total, Pool2dShape g, const T* __restrict__ gy, Strides4 ys,
                                         T* __restrict__ gx, Strides4 xs, bool cl, bool count_include_pad,
                                         int64_t divisor_override) {
  using C = compute_t<T>;
  for (I i = first_index<I>(); i < total; i += grid_step<I>()) {
    const Pos p = decode<I>(i, I(g.c), I(g.ih), I(g.iw), cl);
    // windows [o * s - pad, o * s - pad + k) that contain (h, w); their clipped part does too
    const int64_t oy0 = first_window(p.h, g.ph, g.kh, g.sh), ox0 = first_window(p.w, g.pw, g.kw, g.sw);
    const int64_t oy1 = min64(g.oh, (p.h + g.ph) / g.sh + 1), ox1 = min64(g.ow, (p.w + g.pw) / g.sw + 1);
    const int64_t base = p.n * ys.n + p.c * ys.c;
    C acc = C(0);
    for (int64_t oy = oy0; oy < oy1; ++oy)
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        const pool_math::AvgWindow2d win = avg_window2d(g, oy, ox, count_include_pad, divisor_override);
        acc += static_cast<C>(gy[base + oy * ys.h + ox * ys.w]) * static_cast<C>(win.inv);
      }
    gx[p.n * xs.n + p.c * xs.c + p.h * xs.h + p.w * xs.w] = T(acc);
  }
}

// ---- adaptive average pooling -----------------------------------------------------------------

template <class T, class I>
__global__ void adaptive_forward_kernel(I total, Pool2dShape g, const T* __restrict__ x, Strides4 xs,
                                        T* __restrict__ y, Strides4 ys, bool cl) {
  using C = compute_t<T>;
  for (I i = first_index<I>(); i < total; i += grid_step<I>()) {
    const Pos o = decode<I>(i, I(g.c), I(g.oh), I(g.ow), cl);
    const int64_t h0 = adaptive_start(o.h, g.ih, g.oh), h1 = adaptive_end(o.h, g.ih, g.oh);
    const int64_t w0 = adaptive_start(o.w, g.iw, g.ow), w1 = adaptive_end(o.w, g.iw, g.ow);
    const C inv = static_cast<C>(1.0 / double((h1 - h0) * (w1 - w0)));
    const T* xp = x + o.n * xs.n + o.c * xs.c;
    C s = C(0);
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) s += static_cast<C>(xp[h * xs.h + w * xs.w]);
    y[o.n * ys.n + o.c * ys.c + o.h * ys.h + o.w * ys.w] = T(s * inv);
  }
}

template <class T, class I>
__global__ void adaptive_backward_kernel(I total, Pool2dShape g, const T* __restrict__ gy, Strides4 ys,
                                         T* __restrict__ gx, Strides4 xs, bool cl) {
  using C = compute_t<T>;
  for (I i = first_index<I>(); i < total; i += grid_step<I>()) {
    const Pos p = decode<I>(i, I(g.c), I(g.ih), I(g.iw), cl);
    // output o covers h exactly when floor(h * out / in) <= o < ceil((h + 1) * out / in)
    const int64_t oy0 = (p.h * g.oh) / g.ih, oy1 = min64(g.oh, ((p.h + 1) * g.oh + g.ih - 1) / g.ih);
    const int64_t ox0 = (p.w * g.ow) / g.iw, ox1 = min64(g.ow, ((p.w + 1) * g.ow + g.iw - 1) / g.iw);
    const int64_t base = p.n * ys.n + p.c * ys.c;
    C acc = C(0);
    for (int64_t oy = oy0; oy < oy1; ++oy) {
      const int64_t rows = adaptive_end(oy, g.ih, g.oh) - adaptive_start(oy, g.ih, g.oh);
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        const int64_t cols = adaptive_end(ox, g.iw, g.ow) - adaptive_start(ox, g.iw, g.ow);
        const C inv = static_cast<C>(1.0 / double(rows * cols));
        acc += static_cast<C>(gy[base + oy * ys.h + ox * ys.w]) * inv;
      }
    }
    gx[p.n * xs.n + p.c * xs.c + p.h * xs.h + p.w * xs.w] = T(acc);
  }
}

bool channels_last(const Strides4& a, const Strides4& b) { return a.c == 1 && b.c == 1; }

}  // namespace

template <class T>
cudaError_t max_pool2d_forward(const Pool2dShape& g, cudaStream_t s, const T* x, const Strides4& xs, T* y,
                               int64_t* indices, const Strides4& ys) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  const int blocks = grid_stride_blocks(total, kPoolThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    max_pool_forward_kernel<T, I><<<blocks, kPoolThreads, 0, s>>>(I(total), g, x, xs, y, indices, ys,
                                                                  channels_last(xs, ys));
  });
}

template <class T>
cudaError_t max_pool2d_backward(const Pool2dShape& g, cudaStream_t s, const T* gy, const int64_t* indices,
                                const Strides4& ys, T* gx, const Strides4& xs) {
  const int64_t total = g.n * g.c * g.ih * g.iw;
  const int blocks = grid_stride_blocks(total, kPoolThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    max_pool_backward_kernel<T, I><<<blocks, kPoolThreads, 0, s>>>(I(total), g, gy, indices, ys, gx, xs,
                                                                   channels_last(xs, ys));
  });
}

template <class T>
cudaError_t avg_pool2d_forward(const Pool2dShape& g, cudaStream_t s, const T* x, const Strides4& xs, T* y,
                               const Strides4& ys, bool count_include_pad, int64_t divisor_override) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  const int blocks = grid_stride_blocks(total, kPoolThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    avg_pool_forward_kernel<T, I><<<blocks, kPoolThreads, 0, s>>>(
        I(total), g, x, xs, y, ys, channels_last(xs, ys), count_include_pad, divisor_override);
  });
}

template <class T>
cudaError_t avg_pool2d_backward(const Pool2dShape& g, cudaStream_t s, const T* gy, const Strides4& ys, T* gx,
                                const Strides4& xs, bool count_include_pad, int64_t divisor_override) {
  const int64_t total = g.n * g.c * g.ih * g.iw;
  const int blocks = grid_stride_blocks(total, kPoolThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    avg_pool_backward_kernel<T, I><<<blocks, kPoolThreads, 0, s>>>(
        I(total), g, gy, ys, gx, xs, channels_last(xs, ys), count_include_pad, divisor_override);
  });
}

template <class T>
cudaError_t adaptive_avg_pool2d_forward(const Pool2dShape& g, cudaStream_t s, const T* x, const Strides4& xs, T* y,
                                        const Strides4& ys) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  const int blocks = grid_stride_blocks(total, kPoolThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    adaptive_forward_kernel<T, I><<<blocks, kPoolThreads, 0, s>>>(I(total), g, x, xs, y, ys, channels_last(xs, ys));
  });
}

template <class T>
cudaError_t adaptive_avg_pool2d_backward(const Pool2dShape& g, cudaStream_t s, const T* gy, const Strides4& ys,
                                         T* gx, const Strides4& xs) {
  const int64_t total = g.n * g.c * g.ih * g.iw;
  const int blocks = grid_stride_blocks(total, kPoolThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    adaptive_backward_kernel<T, I><<<blocks, kPoolThreads, 0, s>>>(I(total), g, gy, ys, gx, xs, channels_last(xs, ys));
  });
}

#define STRATA_POOL_INSTANCES(T)                                                                                 \
  template cudaError_t max_pool2d_forward<T>(const Pool2dShape&, cudaStream_t, const T*, const Strides4&, T*,    \
                                             int64_t*, const Strides4&);                                         \
  template cudaError_t max_pool2d_backward<T>(const Pool2dShape&, cudaStream_t, const T*, const int64_t*,        \
                                              const Strides4&, T*, const Strides4&);                             \
  template cudaError_t avg_pool2d_forward<T>(const Pool2dShape&, cudaStream_t, const T*, const Strides4&, T*,    \
                                             const Strides4&, bool, int64_t);                                    \
  template cudaError_t avg_pool2d_backward<T>(const Pool2dShape&, cudaStream_t, const T*, const Strides4&, T*,   \
                                              const Strides4&, bool, int64_t);                                   \
  template cudaError_t adaptive_avg_pool2d_forward<T>(const Pool2dShape&, cudaStream_t, const T*,                \
                                                      const Strides4&, T*, const Strides4&);                     \
  template cudaError_t adaptive_avg_pool2d_backward<T>(const Pool2dShape&, cudaStream_t, const T*,               \
                                                       const Strides4&, T*, const Strides4&);
STRATA_POOL_INSTANCES(float)
STRATA_POOL_INSTANCES(double)
STRATA_POOL_INSTANCES(Half)
STRATA_POOL_INSTANCES(BFloat16)
#undef STRATA_POOL_INSTANCES

}  // namespace strata::cuda_kernels
