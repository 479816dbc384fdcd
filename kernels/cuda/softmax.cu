// CUDA softmax and log_softmax (causal too) along one dim of a contiguous (outer, n, inner)
// array, and their gradients (two passes: the row's total, then dx). Three passes over a
// row: its max, its sum of exponentials, the outputs (Note [Softmax passes]). A last-dim row
// goes to a warp (or part of one) when short and to a whole block when long; for another dim,
// threads run along the contiguous inner dim and split the softmax dim between them, as the
// outer reduction layout does (reduce.cuh).
#include <cmath>

#include "../common/softmax_math.h"
#include "reduce.cuh"

namespace strata::cuda_kernels {

namespace {

namespace rd = reduce_detail;

inline constexpr int64_t kWarpRowMax = 1024;  // rows up to this long take at most a warp
inline constexpr int kMaxRowThreads = 1024;

// Note [Softmax passes]
// As on the CPU (kernels/cpu/softmax.h): the row's max (NaN wins), the sum of exp(x - max) in
// the accumulation type, then the outputs. A row of -inf, or one holding +inf or NaN, comes
// out NaN, as there. The row is read three times; a short row's later reads hit L1. (An online
// max-and-sum saves a read but rescales its partial sums at every merge, and in double for
// float32 that arithmetic, not memory, set the speed: 112 us for attention's 256-wide rows.)

// y = exp(x - m) / s, or x - m - log(s).
template <class T, class C, class Acc>
struct RowOutput {
  C m, fin;  // fin: 1 / s, or log(s)
  bool log;
  __device__ RowOutput(C m_, Acc s, bool log_)
      : m(m_), fin(log_ ? static_cast<C>(std::log(s)) : static_cast<C>(Acc(1) / s)), log(log_) {}
  __device__ T operator()(T x) const {
    const C v = static_cast<C>(x) - m;
    return log ? convert<T>(v - fin) : convert<T>(std::exp(v) * fin);
  }
};

// Rows along x (blockDim.x threads each, a power of two), blockDim.y rows per block. With
// causal_rows, row r keeps its first causal_row_length(r) elements and writes `masked` past
// them. Shared memory: blockDim.y * blockDim.x / 32 accumulators.
template <class T>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool log, int64_t causal_rows) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  const T masked = log ? convert<T>(-INFINITY) : convert<T>(0.0f);
  const int64_t groups = (rows + blockDim.y - 1) / blockDim.y;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // uniform across the block
    const int64_t row = g * blockDim.y + threadIdx.y;
    const bool live = row < rows;
    const int64_t keep = live ? math::causal_row_length(row, causal_rows, n) : 0;
    const T* xr = x + (live ? row : 0) * n;
    C m = math::lowest<C>();
    for (int64_t i = threadIdx.x; i < keep; i += blockDim.x) m = math::max_nan(m, static_cast<C>(xr[i]));
    m = rd::block_reduce_x(m, [](C a, C b) { return math::max_nan(a, b); }, reinterpret_cast<C*>(smem_bytes));
    Acc s = 0;
    for (int64_t i = threadIdx.x; i < keep; i += blockDim.x) s += static_cast<Acc>(std::exp(static_cast<C>(xr[i]) - m));
    s = rd::block_reduce_x(s, [](Acc a, Acc b) { return a + b; }, reinterpret_cast<Acc*>(smem_bytes));
    if (live) {
      const RowOutput<T, C, Acc> out(m, s, log);
      T* yr = y + row * n;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = i < keep ? out(xr[i]) : masked;
    }
  }
}

// Columns (outer index, inner index) along x, the softmax dim split along y. Shared memory:
// blockDim.x * blockDim.y accumulators.
template <class T>
__global__ void __launch_bounds__(rd::kBlockThreads)
    softmax_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  const int64_t cols = outer * inner, groups = (cols + blockDim.x - 1) / blockDim.x;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // uniform across the block
    const int64_t col = g * blockDim.x + threadIdx.x;
    const bool live = col < cols;
    const int64_t base = live ? (col / inner) * n * inner + col % inner : 0;
    const int64_t len = live ? n : 0;
    C m = math::lowest<C>();
    for (int64_t i = threadIdx.y; i < len; i += blockDim.y) m = math::max_nan(m, static_cast<C>(x[base + i * inner]));
    m = rd::block_reduce_y(m, [](C a, C b) { return math::max_nan(a, b); }, reinterpret_cast<C*>(smem_bytes));
    Acc s = 0;
    for (int64_t i = threadIdx.y; i < len; i += blockDim.y)
      s += static_cast<Acc>(std::exp(static_cast<C>(x[base + i * inner]) - m));
    s = rd::block_reduce_y(s, [](Acc a, Acc b) { return a + b; }, reinterpret_cast<Acc*>(smem_bytes));
    if (live) {
      const RowOutput<T, C, Acc> out(m, s, log);
      for (int64_t i = threadIdx.y; i < n; i += blockDim.y) y[base + i * inner] = out(x[base + i * inner]);
    }
  }
}

template <class T, class C, class Acc>
__device__ __forceinline__ T grad_of(T y, T g, Acc total, bool log) {
  const C yv = static_cast<C>(y), gv = static_cast<C>(g);
  return convert<T>(log ? math::log_softmax_grad(yv, gv, total) : math::softmax_grad(yv, gv, total));
}

// softmax_backward over rows, laid out as softmax_rows.
template <class T>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx, int64_t rows,
                          int64_t n, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Acc* smem = reinterpret_cast<Acc*>(smem_bytes);
  const int64_t groups = (rows + blockDim.y - 1) / blockDim.y;
  for (int64_t b = blockIdx.x; b < groups; b += gridDim.x) {  // uniform across the block
    const int64_t row = b * blockDim.y + threadIdx.y;
    const bool live = row < rows;
    Acc total = 0;
    if (live)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        total += math::softmax_grad_term(static_cast<C>(y[row * n + i]), static_cast<C>(g[row * n + i]), log);
    total = rd::block_reduce_x(total, [](Acc a, Acc c) { return a + c; }, smem);
    if (live)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        dx[row * n + i] = grad_of<T, C>(y[row * n + i], g[row * n + i], total, log);
  }
}

// softmax_backward over columns, laid out as softmax_cols.
template <class T>
__global__ void __launch_bounds__(rd::kBlockThreads)
    softmax_backward_cols(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx, int64_t outer,
                          int64_t n, int64_t inner, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Acc* smem = reinterpret_cast<Acc*>(smem_bytes);
  const int64_t cols = outer * inner, groups = (cols + blockDim.x - 1) / blockDim.x;
  for (int64_t b = blockIdx.x; b < groups; b += gridDim.x) {  // uniform across the block
    const int64_t col = b * blockDim.x + threadIdx.x;
    const bool live = col < cols;
    const int64_t base = live ? (col / inner) * n * inner + col % inner : 0;
    Acc total = 0;
    if (live)
      for (int64_t i = threadIdx.y; i < n; i += blockDim.y) {
        const int64_t k = base + i * inner;
        total += math::softmax_grad_term(static_cast<C>(y[k]), static_cast<C>(g[k]), log);
      }
    total = rd::block_reduce_y(total, [](Acc a, Acc c) { return a + c; }, smem);
    if (live)
      for (int64_t i = threadIdx.y; i < n; i += blockDim.y) {
        const int64_t k = base + i * inner;
        dx[k] = grad_of<T, C>(y[k], g[k], total, log);
      }
  }
}

// The block shape, shared memory (values of `state_bytes` each) and block count of the row
// (inner == 1) or column layout.
struct Launch {
  int bx, by;
  size_t smem;
  unsigned grid;
};

Launch launch_shape(int64_t outer, int64_t n, int64_t inner, size_t state_bytes) {
  Launch l;
  int64_t groups;
  if (inner == 1) {
    l.bx = n <= kWarpRowMax ? rd::pow2_at_least(rd::ceil_div(n, 4), 32)
                            : rd::pow2_at_least(rd::ceil_div(n, 8), kMaxRowThreads);
    l.by = l.bx < rd::kBlockThreads ? rd::kBlockThreads / l.bx : 1;
    l.smem = static_cast<size_t>(l.bx > 32 ? l.by * l.bx / 32 : 0) * state_bytes;
    groups = rd::ceil_div(outer, l.by);
  } else {
    const int64_t cols = outer * inner;
    l.bx = rd::pow2_at_least(cols, 32);
    l.by = rd::pow2_at_least(rd::ceil_div(n, 4), rd::kBlockThreads / l.bx);
    if (l.bx * l.by < rd::kBlockThreads) l.bx = rd::pow2_at_least(cols, rd::kBlockThreads / l.by);
    l.smem = static_cast<size_t>(l.bx * l.by) * state_bytes;
    groups = rd::ceil_div(cols, l.bx);
  }
  l.grid = static_cast<unsigned>(std::min(groups, rd::kMaxGridX));
  return l;
}

}  // namespace

template <class T>
cudaError_t softmax(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner, bool log,
                    int64_t causal_rows) {
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  const Launch l = launch_shape(outer, n, inner, sizeof(math::acc_t<T>));  // at least sizeof(compute_t<T>)
  if (inner == 1) softmax_rows<<<l.grid, dim3(l.bx, l.by), l.smem, s>>>(x, y, outer, n, log, causal_rows);
  else softmax_cols<<<l.grid, dim3(l.bx, l.by), l.smem, s>>>(x, y, outer, n, inner, log);
  return cudaGetLastError();
}

template <class T>
cudaError_t softmax_backward(cudaStream_t s, T* dx, const T* y, const T* g, int64_t outer, int64_t n, int64_t inner,
                             bool log) {
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  const Launch l = launch_shape(outer, n, inner, sizeof(math::acc_t<T>));
  if (inner == 1) softmax_backward_rows<<<l.grid, dim3(l.bx, l.by), l.smem, s>>>(y, g, dx, outer, n, log);
  else softmax_backward_cols<<<l.grid, dim3(l.bx, l.by), l.smem, s>>>(y, g, dx, outer, n, inner, log);
  return cudaGetLastError();
}

// Explicit instances: the floating dtypes.
#define STRATA_SOFTMAX(T)                                                                                    \
  template cudaError_t softmax<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int64_t, bool, int64_t);     \
  template cudaError_t softmax_backward<T>(cudaStream_t, T*, const T*, const T*, int64_t, int64_t, int64_t, bool);
STRATA_SOFTMAX(Half)
STRATA_SOFTMAX(BFloat16)
STRATA_SOFTMAX(float)
STRATA_SOFTMAX(double)
#undef STRATA_SOFTMAX

}  // namespace strata::cuda_kernels
