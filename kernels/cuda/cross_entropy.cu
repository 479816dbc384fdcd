// CUDA fused softmax cross-entropy over the rows of contiguous (rows, c) logits with class
// indices, the math of kernels/common/cross_entropy_math.h. The forward reads each row once:
// every thread folds its strided share into an online logsumexp (Note [Online logsumexp])
// and, with label smoothing, a weighted sum of the logits; a warp (rows up to 1024 classes)
// or a block (longer rows) merges them in a fixed order. The backward is elementwise over
// (rows, c), each element recomputing its softmax value from the saved logsumexp.
#include <cmath>

#include "../common/convert.h"
#include "../common/cross_entropy_math.h"
#include "nn_norm_ops.h"
#include "row_reduce.cuh"

namespace strata::cuda_kernels {

namespace {

constexpr int kRowWarpMax = 1024;      // longest row one warp takes
constexpr int kWarpsPerBlock = 4;      // rows per block on the warp path
constexpr int kRowBlockThreads = 256;  // threads per row on the block path
constexpr int kThreads = 256;          // elementwise backward
constexpr int64_t kMaxGridX = 2147483647;

// A thread's (then a warp's, a block's) share of a row.
template <class C> struct RowState {
  math::OnlineLse<C> lse;
  C wx;  // sum of w_j (x_j - shift), with label smoothing
};

struct MergeRowState {
  template <class C>
  __device__ __forceinline__ RowState<C> operator()(const RowState<C>& a, const RowState<C>& b) const {
    return {math::lse_merge(a.lse, b.lse), a.wx + b.wx};
  }
};

// kWarpRow: a warp per row, kWarpsPerBlock rows per block; else a block per row.
template <class T, bool kWarpRow>
__global__ void __launch_bounds__(kWarpRow ? kWarpSize * kWarpsPerBlock : kRowBlockThreads)
    ce_forward(const T* __restrict__ x, const int64_t* __restrict__ target, const T* __restrict__ w,
               T* __restrict__ loss, compute_t<T>* __restrict__ lse, int64_t rows, int64_t c, int64_t ignore_index,
               compute_t<T> eps, compute_t<T> total_w) {
  using C = compute_t<T>;
  int64_t row;
  int tid, nthreads;
  if constexpr (kWarpRow) {
    row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
    tid = threadIdx.x % kWarpSize;
    nthreads = kWarpSize;
    if (row >= rows) return;  // the whole warp leaves together
  } else {
    row = blockIdx.x;
    tid = threadIdx.x;
    nthreads = blockDim.x;
  }
  const T* xr = x + row * c;
  const C shift = math::ce_shift(static_cast<C>(xr[0]));
  const bool smooth = eps > C(0);
  RowState<C> st{math::lse_start<C>(), C(0)};
  for (int64_t j = tid; j < c; j += nthreads) {
    const C v = static_cast<C>(xr[j]);
    math::lse_push(st.lse, v);
    if (smooth) st.wx += (w ? static_cast<C>(w[j]) : C(1)) * (v - shift);
  }
  if constexpr (kWarpRow) {
    st = warp_allreduce(st, MergeRowState{});
  } else {
    __shared__ RowState<C> scratch[kWarpSize];
    st = block_allreduce(st, MergeRowState{}, scratch);
  }
  if (tid != 0) return;
  const C l = math::lse_value(st.lse);
  lse[row] = l;
  const int64_t t = target[row];
  C out = 0;
  if (t != ignore_index) {
    if (!math::ce_in_range(t, c)) {
      out = static_cast<C>(NAN);
    } else {
      const C w_t = w ? static_cast<C>(w[t]) : C(1);
      out = math::ce_row_loss<C>(l, static_cast<C>(xr[t]), w_t, st.wx, shift, total_w, eps, c);
    }
  }
  loss[row] = convert<T>(out);
}

// Index: int32_t when rows * c and the grid stride stay below 2^31, else int64_t.
template <class T, class Index>
__global__ void __launch_bounds__(kThreads)
    ce_backward(const T* __restrict__ g, int64_t g_stride, const T* __restrict__ x,
                const int64_t* __restrict__ target, const compute_t<T>* __restrict__ lse, const T* __restrict__ w,
                T* __restrict__ gx, Index rows, Index c, int64_t ignore_index, compute_t<T> eps,
                compute_t<T> total_w) {
  using C = compute_t<T>;
  const Index total = rows * c;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const Index r = i / c, j = i - r * c;
    const int64_t t = target[r];
    C v;
    if (t != ignore_index && !math::ce_in_range(t, c)) {
      v = static_cast<C>(NAN);
    } else {
      const bool valid = t != ignore_index;
      const C w_t = valid && w ? static_cast<C>(w[t]) : C(1);
      const auto row = math::ce_grad_row<C>(static_cast<C>(g[r * g_stride]), valid, w_t, total_w, eps, c);
      v = math::ce_grad(row, static_cast<C>(x[i]), static_cast<C>(lse[r]), w ? static_cast<C>(w[j]) : C(1),
                        valid && j == t);
    }
    gx[i] = convert<T>(v);
  }
}

}  // namespace

template <class T>
cudaError_t cross_entropy_forward(cudaStream_t stream, const T* x, const int64_t* target, const T* w, T* loss,
                                  compute_t<T>* lse, int64_t rows, int64_t c, int64_t ignore_index, double eps,
                                  double total_weight) {
  if (rows <= 0 || c <= 0) return cudaSuccess;
  if (rows > kMaxGridX) return cudaErrorInvalidValue;
  using C = compute_t<T>;
  const C total_w = static_cast<C>(w ? total_weight : static_cast<double>(c));
  if (c <= kRowWarpMax) {
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    ce_forward<T, true><<<static_cast<unsigned>(blocks), kWarpSize * kWarpsPerBlock, 0, stream>>>(
        x, target, w, loss, lse, rows, c, ignore_index, static_cast<C>(eps), total_w);
  } else {
    ce_forward<T, false><<<static_cast<unsigned>(rows), kRowBlockThreads, 0, stream>>>(
        x, target, w, loss, lse, rows, c, ignore_index, static_cast<C>(eps), total_w);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t cross_entropy_backward(cudaStream_t stream, const T* g, int64_t g_stride, const T* x,
                                   const int64_t* target, const compute_t<T>* lse, const T* w, T* gx, int64_t rows,
                                   int64_t c, int64_t ignore_index, double eps, double total_weight) {
  if (rows <= 0 || c <= 0) return cudaSuccess;
  using C = compute_t<T>;
  const C total_w = static_cast<C>(w ? total_weight : static_cast<double>(c));
  const int64_t total = rows * c;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65536 ? blocks : 65536);
  // the last grid-stride step must not overflow the index either
  if (total + static_cast<int64_t>(grid) * kThreads < (int64_t(1) << 31)) {
    ce_backward<T, int32_t><<<grid, kThreads, 0, stream>>>(g, g_stride, x, target, lse, w, gx,
                                                           static_cast<int32_t>(rows), static_cast<int32_t>(c),
                                                           ignore_index, static_cast<C>(eps), total_w);
  } else {
    ce_backward<T, int64_t><<<grid, kThreads, 0, stream>>>(g, g_stride, x, target, lse, w, gx, rows, c, ignore_index,
                                                           static_cast<C>(eps), total_w);
  }
  return cudaGetLastError();
}

// Explicit instances for the dtypes the registry uses.
#define STRATA_CROSS_ENTROPY(T)                                                                                    \
  template cudaError_t cross_entropy_forward<T>(cudaStream_t, const T*, const int64_t*, const T*, T*,              \
                                                compute_t<T>*, int64_t, int64_t, int64_t, double, double);          \
  template cudaError_t cross_entropy_backward<T>(cudaStream_t, const T*, int64_t, const T*, const int64_t*,        \
                                                 const compute_t<T>*, const T*, T*, int64_t, int64_t, int64_t,      \
                                                 double, double);
STRATA_CROSS_ENTROPY(Half)
STRATA_CROSS_ENTROPY(BFloat16)
STRATA_CROSS_ENTROPY(float)
STRATA_CROSS_ENTROPY(double)
#undef STRATA_CROSS_ENTROPY

}  // namespace strata::cuda_kernels
