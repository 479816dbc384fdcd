// CUDA kernels of batch normalization (entry points in nn_ops.h), the CPU kernels' two
// primitives (kernels/cpu/batch_norm.h) on the GPU:
//
//   channel sums    s1[c] = sum (u - su[c]),  s2[c] = sum (u - su[c]) * (v - sv[c])   in double
//   channel affine  out = a[c] * u + b[c] * v + k[c]                                 in compute_t<T>
//                   (the forward then adds an optional residual and applies an optional ReLU)
//
// with the per-channel statistics and coefficients computed between them by one thread per
// channel, from the same double-precision formulas as the CPU (so mean, var and the
// gradients agree with the CPU's up to summation order). After a fused ReLU the backward
// reads u (the output's gradient) through the forward's output as a mask, ReluBackward(u, y),
// in both passes (Note [ReLU mask in the backward] in src/nn/batchnorm.cpp).
//
// Sums are two-stage and deterministic: a grid of (channel tile, split) blocks writes one
// partial per (split, channel) to the scratch buffer, and the finalize kernel adds the splits
// in order. NCHW data: a block per (channel, split), threads along the contiguous spatial run.
// Channels-last data: 32 channels per block along x (coalesced), rows along y.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../common/activation_grad_math.h"
#include "../common/half.h"
#include "../common/unary_math.h"
#include "elementwise.cuh"
#include "nn_ops.h"

namespace strata::cuda_kernels {

namespace {

constexpr int kSumThreads = 256;         // NCHW sums: threads per block
constexpr int kTileC = 32, kTileRows = 8;  // channels-last sums: block shape
constexpr int kFinalizeThreads = 128;
constexpr int kAffineThreads = 256;
constexpr int64_t kMaxSplits = 65535;    // gridDim.y

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// How the sums are split: enough blocks to fill the GPU, each with a few thousand elements.
struct SumPlan {
  int64_t splits;
  dim3 grid, block;
};

SumPlan sum_plan(const ChannelLayout& l) {
  const int64_t m = l.n * l.s;
  if (l.channels_inner) {
    const int64_t tiles = ceil_div(l.c, kTileC);
    const int64_t splits = clamp64(ceil_div(m, kTileRows * 64), 1, std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, 1024 / tiles)));
    return {splits, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), dim3(kTileC, kTileRows)};
  }
  const int64_t splits = clamp64(ceil_div(m, kSumThreads * 16), 1, std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, 1024 / l.c)));
  return {splits, dim3(static_cast<unsigned>(l.c), static_cast<unsigned>(splits)), dim3(kSumThreads)};
}

// Offset of channel c's first element (n = 0, s = 0).
__device__ __forceinline__ int64_t channel_first(const ChannelLayout& l, int64_t c) {
  return l.channels_inner ? c : c * l.s;
}

// The operands of one channel-sum pass. v null: s1 only. shift_first: both u and v are
// shifted by u's first element of the channel (the forward's variance); otherwise u is not
// shifted and v by shift_v[c] (null: 0). u_mask: u is read as ReluBackward(u, u_mask).
template <class T, class S>
struct SumArgs {
  const T* u;
  const T* v;
  const S* shift_v;
  bool shift_first;
  const T* u_mask = nullptr;
};

template <class T, class S>
__device__ __forceinline__ void channel_shifts(const ChannelLayout& l, const SumArgs<T, S>& a, int64_t c, double& su,
                                               double& sv) {
  using C = compute_t<T>;
  if (a.shift_first) {
    su = sv = static_cast<double>(static_cast<C>(a.u[channel_first(l, c)]));
  } else {
    su = 0.0;
    sv = a.shift_v ? static_cast<double>(a.shift_v[c]) : 0.0;
  }
}

// Block-wide sum of two doubles over a 1-d block of kSumThreads; thread 0 gets the result.
__device__ __forceinline__ void block_sum2(double& a1, double& a2) {
  __shared__ double w1[kSumThreads / 32], w2[kSumThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    a1 += __shfl_down_sync(0xffffffffu, a1, o);
    a2 += __shfl_down_sync(0xffffffffu, a2, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) w1[warp] = a1, w2[warp] = a2;
  __syncthreads();
  if (threadIdx.x == 0) {
    a1 = a2 = 0.0;
    for (int k = 0; k < kSumThreads / 32; ++k) a1 += w1[k], a2 += w2[k];
  }
}

// NCHW: block (c, split) sums positions m in [lo, hi) of the channel's n * s run, m = n * S + s.
template <class T, class S>
__global__ void sums_outer_kernel(ChannelLayout l, int64_t splits, SumArgs<T, S> a, double* __restrict__ part) {
  using C = compute_t<T>;
  const int64_t c = blockIdx.x, k = blockIdx.y, m_total = l.n * l.s;
  const int64_t lo = m_total * k / splits, hi = m_total * (k + 1) / splits;
  double su = 0.0, sv = 0.0;
  if (m_total > 0) channel_shifts(l, a, c, su, sv);  // the shift reads the channel's first element
  double a1 = 0.0, a2 = 0.0;
  int64_t m = lo + threadIdx.x;
  if (m < hi) {
    // (n, s) of m, advanced by blockDim.x each step without a division
    int64_t n = m / l.s, s = m % l.s;
    const int64_t qn = blockDim.x / l.s, qs = blockDim.x % l.s;
    const int64_t plane = l.c * l.s, cs = c * l.s;
    for (; m < hi; m += blockDim.x) {
      const int64_t off = n * plane + cs + s;
      const double du = static_cast<double>(math::relu_masked(a.u, a.u_mask, off)) - su;
      a1 += du;
      if (a.v) a2 += du * (static_cast<double>(static_cast<C>(a.v[off])) - sv);
      s += qs, n += qn;
      if (s >= l.s) s -= l.s, ++n;
    }
  }
  block_sum2(a1, a2);
  if (threadIdx.x == 0) {
    part[k * l.c + c] = a1;
    part[(splits + k) * l.c + c] = a2;
  }
}

// Channels-last: block (tile, split); thread (x, y) sums channel tile * 32 + x over rows
// y + split * 8, stepping by 8 * splits.
template <class T, class S>
__global__ void sums_inner_kernel(ChannelLayout l, int64_t splits, SumArgs<T, S> a, double* __restrict__ part) {
  using C = compute_t<T>;
  __shared__ double t1[kTileRows][kTileC + 1], t2[kTileRows][kTileC + 1];
  const int64_t c = int64_t(blockIdx.x) * kTileC + threadIdx.x, rows = l.n * l.s;
  double a1 = 0.0, a2 = 0.0;
  if (c < l.c && rows > 0) {
    double su, sv;
    channel_shifts(l, a, c, su, sv);
    const int64_t step = int64_t(gridDim.y) * kTileRows;
    for (int64_t r = int64_t(blockIdx.y) * kTileRows + threadIdx.y; r < rows; r += step) {
      const int64_t off = r * l.c + c;
      const double du = static_cast<double>(math::relu_masked(a.u, a.u_mask, off)) - su;
      a1 += du;
      if (a.v) a2 += du * (static_cast<double>(static_cast<C>(a.v[off])) - sv);
    }
  }
  t1[threadIdx.y][threadIdx.x] = a1;
  t2[threadIdx.y][threadIdx.x] = a2;
  __syncthreads();
  if (threadIdx.y == 0 && c < l.c) {
    for (int y = 1; y < kTileRows; ++y) a1 += t1[y][threadIdx.x], a2 += t2[y][threadIdx.x];
    part[int64_t(blockIdx.y) * l.c + c] = a1;
    part[(splits + blockIdx.y) * l.c + c] = a2;
  }
}

template <class T, class S>
cudaError_t launch_sums(const ChannelLayout& l, const SumPlan& p, cudaStream_t s, const SumArgs<T, S>& a,
                        double* part) {
  if (l.channels_inner) sums_inner_kernel<T, S><<<p.grid, p.block, 0, s>>>(l, p.splits, a, part);
  else sums_outer_kernel<T, S><<<p.grid, p.block, 0, s>>>(l, p.splits, a, part);
  return cudaGetLastError();
}

__device__ __forceinline__ void split_totals(const double* part, int64_t splits, int64_t C, int64_t c, double& s1,
                                             double& s2) {
  s1 = s2 = 0.0;
  for (int64_t k = 0; k < splits; ++k) s1 += part[k * C + c], s2 += part[(splits + k) * C + c];
}

// Forward statistics and the affine coefficients a = weight * invstd, k = bias - mean * a
// (rounded to S as the CPU rounds them).
template <class T, class S>
__global__ void forward_finalize_kernel(ChannelLayout l, int64_t splits, const T* __restrict__ x,
                                        const double* __restrict__ part, const S* weight, const S* bias,
                                        const S* running_mean, const S* running_var, S* mean, S* var, double eps,
                                        bool training, double* __restrict__ coef) {
  using C = compute_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= l.c) return;
  S m = S(0), v = S(0);
  if (training) {
    const int64_t count = l.n * l.s;
    if (count > 0) {  // (the launcher refuses training without values)
      double s1, s2;
      split_totals(part, splits, l.c, c, s1, s2);
      const double shift = static_cast<double>(static_cast<C>(x[channel_first(l, c)]));
      const double m1 = s1 / double(count);
      m = static_cast<S>(shift + m1);
      v = static_cast<S>(fmax(s2 / double(count) - m1 * m1, 0.0));
    }
  } else {
    m = running_mean[c];
    v = running_var[c];
  }
  mean[c] = m;
  var[c] = v;
  const double inv = 1.0 / sqrt(double(v) + eps);
  const double scale = (weight ? double(weight[c]) : 1.0) * inv;
  coef[c] = double(static_cast<S>(scale));
  coef[l.c + c] = double(static_cast<S>((bias ? double(bias[c]) : 0.0) - double(m) * scale));
}

// Backward coefficients: gx = k1 * gy + k2 * x + k3 (k2 = k3 = 0 in eval mode), and the
// weight and bias gradients.
template <class S>
__global__ void backward_finalize_kernel(ChannelLayout l, int64_t splits, bool have_sums,
                                         const double* __restrict__ part, const S* weight, const S* mean,
                                         const S* var, S* gweight, S* gbias, double eps, bool training,
                                         double* __restrict__ coef) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= l.c) return;
  double sg = 0.0, sgx = 0.0;
  if (have_sums) split_totals(part, splits, l.c, c, sg, sgx);
  const int64_t count = l.n * l.s;
  const double inv = 1.0 / sqrt(double(var[c]) + eps), wc = weight ? double(weight[c]) : 1.0;
  if (gweight) gweight[c] = static_cast<S>(sgx * inv);
  if (gbias) gbias[c] = static_cast<S>(sg);
  double k2 = 0.0, k3 = 0.0;
  if (training && count > 0) {
    // gx = w * inv * (gy - mean(gy) - (x - mean) * inv^2 * mean(gy * (x - mean)))
    const double b2 = -wc * inv * inv * inv * sgx / double(count);
    k2 = double(static_cast<S>(b2));
    k3 = double(static_cast<S>(-wc * inv * sg / double(count) - b2 * double(mean[c])));
  }
  coef[c] = double(static_cast<S>(wc * inv));
  coef[l.c + c] = k2;
  coef[2 * l.c + c] = k3;
}

template <class T>
__global__ void channel_total_kernel(ChannelLayout l, int64_t splits, const double* __restrict__ part,
                                     T* __restrict__ out) {
  using C = compute_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= l.c) return;
  double s1, s2;
  split_totals(part, splits, l.c, c, s1, s2);
  out[c] = T(static_cast<C>(s1));
}

// The affine pass over the dense data: out = a[c] * u (+ b[c] * v) + k[c], then the forward's
// epilogue: + r (the residual), ReLU. v, b and r may be null; with u_mask, u is read as
// ReluBackward(u, u_mask).
template <class T>
struct AffineArgs {
  const T* u;
  const T* v;
  const T* r;
  T* out;
  const double *a, *b, *k;
  bool relu;
  const T* u_mask = nullptr;
};

template <class T, class I>
__device__ __forceinline__ T affine_value(const AffineArgs<T>& p, compute_t<T> x, compute_t<T> vx, compute_t<T> rx,
                                          I c) {
  using Cp = compute_t<T>;
  Cp y = p.v ? static_cast<Cp>(p.a[c]) * x + static_cast<Cp>(p.b[c]) * vx + static_cast<Cp>(p.k[c])
             : static_cast<Cp>(p.a[c]) * x + static_cast<Cp>(p.k[c]);
  if (p.r) y += rx;
  return T(p.relu ? math::Relu{}(y) : y);
}

// One element per step, i its memory offset.
template <class T, class I>
__global__ void affine_kernel(I total, I C, I S, bool channels_inner, AffineArgs<T> p) {
  using Cp = compute_t<T>;
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const I c = channels_inner ? i % C : (i / S) % C;
    p.out[i] = affine_value(p, math::relu_masked(p.u, p.u_mask, i), p.v ? static_cast<Cp>(p.v[i]) : Cp(0),
                            p.r ? static_cast<Cp>(p.r[i]) : Cp(0), c);
  }
}

// V elements (16 bytes) per step: V consecutive channels of one position (channels-last, C % V
// == 0) or V positions of one channel (NCHW, S % V == 0); every pointer 16-byte aligned.
template <class T, int V, class I>
__global__ void affine_vec_kernel(I nvec, I C, I S, bool channels_inner, AffineArgs<T> p) {
  using Cp = compute_t<T>;
  using VT = Vec<T, V>;
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += step) {
    const I e = i * V, c0 = channels_inner ? e % C : (e / S) % C;
    const VT u = reinterpret_cast<const VT*>(p.u)[i];
    VT v{}, r{}, m{}, o;
    if (p.v) v = reinterpret_cast<const VT*>(p.v)[i];
    if (p.r) r = reinterpret_cast<const VT*>(p.r)[i];
    if (p.u_mask) m = reinterpret_cast<const VT*>(p.u_mask)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const Cp x = p.u_mask ? math::ReluBackward{}(static_cast<Cp>(u.v[j]), static_cast<Cp>(m.v[j]))
                            : static_cast<Cp>(u.v[j]);
      o.v[j] = affine_value(p, x, static_cast<Cp>(v.v[j]), static_cast<Cp>(r.v[j]), channels_inner ? c0 + j : c0);
    }
    reinterpret_cast<VT*>(p.out)[i] = o;
  }
}

template <class T>
cudaError_t launch_affine(const ChannelLayout& l, cudaStream_t s, const AffineArgs<T>& p) {
  const int64_t total = l.n * l.c * l.s;
  if (total == 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  const bool vec = aligned16(p.u) && aligned16(p.out) && (!p.v || aligned16(p.v)) && (!p.r || aligned16(p.r)) &&
                   (!p.u_mask || aligned16(p.u_mask)) && (l.channels_inner ? l.c % V == 0 : l.s % V == 0);
  const int64_t work = vec ? total / V : total;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(work, kAffineThreads), 65536));
  auto launch = [&](auto index) {
    using I = decltype(index);
    const I c = I(l.c), sp = I(l.s > 0 ? l.s : 1);
    if (vec) affine_vec_kernel<T, V, I><<<blocks, kAffineThreads, 0, s>>>(I(work), c, sp, l.channels_inner, p);
    else affine_kernel<T, I><<<blocks, kAffineThreads, 0, s>>>(I(work), c, sp, l.channels_inner, p);
  };
  if (total < (int64_t(1) << 31)) launch(uint32_t{});
  else launch(uint64_t{});
  return cudaGetLastError();
}

unsigned finalize_blocks(int64_t c) { return static_cast<unsigned>(ceil_div(c, kFinalizeThreads)); }

}  // namespace

int64_t batch_norm_scratch_doubles(const ChannelLayout& l) {
  if (l.c <= 0) return 1;
  return 2 * l.c * sum_plan(l).splits + 3 * l.c;
}

template <class T>
cudaError_t batch_norm_forward(const ChannelLayout& l, cudaStream_t s, const T* x, T* y, const compute_t<T>* weight,
                               const compute_t<T>* bias, const compute_t<T>* running_mean,
                               const compute_t<T>* running_var, compute_t<T>* mean, compute_t<T>* var, double eps,
                               bool training, const T* residual, bool relu, double* scratch) {
  using S = compute_t<T>;
  if (l.c <= 0) return cudaSuccess;
  const SumPlan p = sum_plan(l);
  double* coef = scratch + 2 * l.c * p.splits;
  if (training) {
    const cudaError_t e = launch_sums<T, S>(l, p, s, SumArgs<T, S>{x, x, nullptr, true}, scratch);
    if (e != cudaSuccess) return e;
  }
  forward_finalize_kernel<T, S><<<finalize_blocks(l.c), kFinalizeThreads, 0, s>>>(
      l, p.splits, x, scratch, weight, bias, running_mean, running_var, mean, var, eps, training, coef);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return launch_affine<T>(l, s, AffineArgs<T>{x, nullptr, residual, y, coef, nullptr, coef + l.c, relu});
}

template <class T>
cudaError_t batch_norm_backward(const ChannelLayout& l, cudaStream_t s, const T* gy, const T* x, T* gx,
                                const compute_t<T>* weight, const compute_t<T>* mean, const compute_t<T>* var,
                                compute_t<T>* gweight, compute_t<T>* gbias, double eps, bool training,
                                const T* relu_out, double* scratch) {
  using S = compute_t<T>;
  if (l.c <= 0) return cudaSuccess;
  const SumPlan p = sum_plan(l);
  double* coef = scratch + 2 * l.c * p.splits;
  const bool have_sums = training || gweight || gbias;
  if (have_sums) {
    const cudaError_t e = launch_sums<T, S>(l, p, s, SumArgs<T, S>{gy, x, mean, false, relu_out}, scratch);
    if (e != cudaSuccess) return e;
  }
  backward_finalize_kernel<S><<<finalize_blocks(l.c), kFinalizeThreads, 0, s>>>(
      l, p.splits, have_sums, scratch, weight, mean, var, gweight, gbias, eps, training, coef);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return launch_affine<T>(l, s, AffineArgs<T>{gy, training ? x : nullptr, nullptr, gx, coef,
                                              training ? coef + l.c : nullptr, coef + 2 * l.c, false, relu_out});
}

template <class T>
cudaError_t channel_sum(const ChannelLayout& l, cudaStream_t s, const T* u, T* out, double* scratch) {
  using S = compute_t<T>;
  if (l.c <= 0) return cudaSuccess;
  const SumPlan p = sum_plan(l);
  const cudaError_t e = launch_sums<T, S>(l, p, s, SumArgs<T, S>{u, nullptr, nullptr, false}, scratch);
  if (e != cudaSuccess) return e;
  channel_total_kernel<T><<<finalize_blocks(l.c), kFinalizeThreads, 0, s>>>(l, p.splits, scratch, out);
  return cudaGetLastError();
}

#define STRATA_BN_INSTANCES(T)                                                                                   \
  template cudaError_t batch_norm_forward<T>(const ChannelLayout&, cudaStream_t, const T*, T*,                   \
                                             const compute_t<T>*, const compute_t<T>*, const compute_t<T>*,      \
                                             const compute_t<T>*, compute_t<T>*, compute_t<T>*, double, bool,    \
                                             const T*, bool, double*);                                           \
  template cudaError_t batch_norm_backward<T>(const ChannelLayout&, cudaStream_t, const T*, const T*, T*,        \
                                              const compute_t<T>*, const compute_t<T>*, const compute_t<T>*,     \
                                              compute_t<T>*, compute_t<T>*, double, bool, const T*, double*);    \
  template cudaError_t channel_sum<T>(const ChannelLayout&, cudaStream_t, const T*, T*, double*);
STRATA_BN_INSTANCES(float)
STRATA_BN_INSTANCES(double)
STRATA_BN_INSTANCES(Half)
STRATA_BN_INSTANCES(BFloat16)
#undef STRATA_BN_INSTANCES

}  // namespace strata::cuda_kernels
