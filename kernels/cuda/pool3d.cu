// CUDA 3-d pooling kernels (entry points and contracts in pool3d.h). Forward: one thread per
// output element, its window by pool_math::window_max / window_mean as on the CPU. Backward: one
// thread per input-gradient element, which gathers the output gradients of the windows that hold
// it (pool_math::outputs_holding), so every element is written once, without atomics or a zero
// fill. Flat indices are 32-bit when the count allows; offsets are 64-bit.
#include <cstdint>

#include "grid_stride.cuh"
#include "pool3d.h"

namespace strata::cuda_kernels {

namespace {

using pool_math::Pool3dShape;
constexpr int kThreads = 256;

struct Pos {
  int64_t plane, d, h, w;
};

// Flat index -> (plane, d, h, w) over (D, H, W) volumes.
template <class I>
__device__ __forceinline__ Pos decode(I i, I D, I H, I W) {
  Pos p;
  p.w = static_cast<int64_t>(i % W), i /= W;
  p.h = static_cast<int64_t>(i % H), i /= H;
  p.d = static_cast<int64_t>(i % D), p.plane = static_cast<int64_t>(i / D);
  return p;
}

#define STRATA_GRID_LOOP(I, i, total)                                           \
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; \
       i += static_cast<I>(gridDim.x) * blockDim.x)

template <class T, class I>
__global__ void max_forward_kernel(I total, Pool3dShape g, const T* __restrict__ x, T* __restrict__ y,
                                   int64_t* __restrict__ indices) {
  const int64_t iv = pool_math::in_volume(g);
  STRATA_GRID_LOOP(I, i, total) {
    const Pos o = decode<I>(i, I(g.dims[0].out), I(g.dims[1].out), I(g.dims[2].out));
    compute_t<T> best;
    pool_math::window_max(x + o.plane * iv, g, o.d, o.h, o.w, best, indices[i]);
    y[i] = T(best);
  }
}

template <class T, class I>
__global__ void avg_forward_kernel(I total, Pool3dShape g, const T* __restrict__ x, T* __restrict__ y) {
  const int64_t iv = pool_math::in_volume(g);
  STRATA_GRID_LOOP(I, i, total) {
    const Pos o = decode<I>(i, I(g.dims[0].out), I(g.dims[1].out), I(g.dims[2].out));
    y[i] = T(pool_math::window_mean<compute_t<T>>(x + o.plane * iv, g, o.d, o.h, o.w));
  }
}

// gx of every input element: the sum over the outputs whose window holds it of max: gy where
// the index names it; average: gy times the window's scale.
template <bool kMax, class T, class I>
__global__ void backward_kernel(I total, Pool3dShape g, const T* __restrict__ gy, const int64_t* __restrict__ indices,
                                T* __restrict__ gx) {
  using C = compute_t<T>;
  const int64_t ov = pool_math::out_volume(g);
  STRATA_GRID_LOOP(I, i, total) {
    const Pos p = decode<I>(i, I(g.dims[0].in), I(g.dims[1].in), I(g.dims[2].in));
    const int64_t target = (p.d * g.dims[1].in + p.h) * g.dims[2].in + p.w;
    const pool_math::OutRange r0 = pool_math::outputs_holding(g.dims[0], p.d, g.adaptive);
    const pool_math::OutRange r1 = pool_math::outputs_holding(g.dims[1], p.h, g.adaptive);
    const pool_math::OutRange r2 = pool_math::outputs_holding(g.dims[2], p.w, g.adaptive);
    C acc = C(0);
    for (int64_t o0 = r0.lo; o0 < r0.hi; ++o0)
      for (int64_t o1 = r1.lo; o1 < r1.hi; ++o1)
        for (int64_t o2 = r2.lo; o2 < r2.hi; ++o2) {
          const int64_t o = p.plane * ov + (o0 * g.dims[1].out + o1) * g.dims[2].out + o2;
          if constexpr (kMax) {
            if (indices[o] == target) acc += static_cast<C>(gy[o]);
          } else {
            pool_math::Taps t[3];
            const double scale = pool_math::avg_scale(g, o0, o1, o2, t);
            if (pool_math::window_holds(t[0], p.d) && pool_math::window_holds(t[1], p.h) &&
                pool_math::window_holds(t[2], p.w))
              acc += static_cast<C>(gy[o]) * static_cast<C>(scale);
          }
        }
    gx[i] = T(acc);
  }
}

}  // namespace

template <class T>
cudaError_t max_pool3d_forward(const Pool3dShape& g, cudaStream_t s, const T* x, T* y, int64_t* indices) {
  const int64_t total = g.planes * pool_math::out_volume(g);
  const int blocks = grid_stride_blocks(total, kThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    max_forward_kernel<T, I><<<blocks, kThreads, 0, s>>>(I(total), g, x, y, indices);
  });
}

template <class T>
cudaError_t max_pool3d_backward(const Pool3dShape& g, cudaStream_t s, const T* gy, const int64_t* indices, T* gx) {
  const int64_t total = g.planes * pool_math::in_volume(g);
  const int blocks = grid_stride_blocks(total, kThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    backward_kernel<true, T, I><<<blocks, kThreads, 0, s>>>(I(total), g, gy, indices, gx);
  });
}

template <class T>
cudaError_t avg_pool3d_forward(const Pool3dShape& g, cudaStream_t s, const T* x, T* y) {
  const int64_t total = g.planes * pool_math::out_volume(g);
  const int blocks = grid_stride_blocks(total, kThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    avg_forward_kernel<T, I><<<blocks, kThreads, 0, s>>>(I(total), g, x, y);
  });
}

template <class T>
cudaError_t avg_pool3d_backward(const Pool3dShape& g, cudaStream_t s, const T* gy, T* gx) {
  const int64_t total = g.planes * pool_math::in_volume(g);
  const int blocks = grid_stride_blocks(total, kThreads);
  return launch_indexed(total, [&](auto tag) {
    using I = decltype(tag);
    backward_kernel<false, T, I><<<blocks, kThreads, 0, s>>>(I(total), g, gy, nullptr, gx);
  });
}

#define STRATA_POOL3D_INSTANCES(T)                                                                           \
  template cudaError_t max_pool3d_forward<T>(const Pool3dShape&, cudaStream_t, const T*, T*, int64_t*);      \
  template cudaError_t max_pool3d_backward<T>(const Pool3dShape&, cudaStream_t, const T*, const int64_t*, T*); \
  template cudaError_t avg_pool3d_forward<T>(const Pool3dShape&, cudaStream_t, const T*, T*);                \
  template cudaError_t avg_pool3d_backward<T>(const Pool3dShape&, cudaStream_t, const T*, T*);
STRATA_POOL3D_INSTANCES(float)
STRATA_POOL3D_INSTANCES(double)
STRATA_POOL3D_INSTANCES(Half)
STRATA_POOL3D_INSTANCES(BFloat16)
#undef STRATA_POOL3D_INSTANCES
#undef STRATA_GRID_LOOP

}  // namespace strata::cuda_kernels
