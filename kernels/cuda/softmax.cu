// CUDA softmax and log_softmax along one dim of a contiguous (outer, n, inner) array. One pass
// folds each row into its max and the sum of exp(x - max) online (Note [Online softmax]); a
// second writes the outputs. A last-dim row goes to a warp (or part of one) when short and to
// a whole block when long; for another dim, threads run along the contiguous inner dim and
// split the softmax dim between them, as the outer reduction layout does (reduce.cuh).
#include <cmath>

#include "reduce.cuh"

namespace strata::cuda_kernels {

namespace {

namespace rd = reduce_detail;

inline constexpr int64_t kWarpRowMax = 1024;  // rows up to this long take at most a warp
inline constexpr int kMaxRowThreads = 1024;

// Note [Online softmax]
// Each thread folds its elements into (m, s): the running max (NaN wins, as on the CPU) and
// the sum of exp(x - m), rescaling s when m grows; partial states merge the same way. While
// m is -inf (only -inf seen) s counts elements instead, since exp(-inf - -inf) is NaN; a row
// of -inf ends NaN either way, as on the CPU. A +inf or NaN max makes s NaN, so the row is NaN,
// again as on the CPU, which sums exp(x - max) after a max pass. The element's exp is taken
// in the compute type as on the CPU, the rescaling factor in the accumulator's precision.
template <class C, class Acc>
struct MaxSum {
  C m;
  Acc s;
};

template <class C, class Acc>
__device__ __forceinline__ Acc rescale(Acc s, C from, C to) {  // s * exp(from - to)
  return from == to ? s : s * std::exp(static_cast<Acc>(from) - static_cast<Acc>(to));
}

template <class C, class Acc>
__device__ __forceinline__ MaxSum<C, Acc> push(MaxSum<C, Acc> a, C x) {
  const C m = math::max_nan(a.m, x);
  if (m == math::lowest<C>()) return {m, a.s + Acc(1)};
  return {m, rescale(a.s, a.m, m) + static_cast<Acc>(std::exp(x - m))};
}

template <class C, class Acc>
__device__ __forceinline__ MaxSum<C, Acc> merge(MaxSum<C, Acc> a, MaxSum<C, Acc> b) {
  const C m = math::max_nan(a.m, b.m);
  if (m == math::lowest<C>()) return {m, a.s + b.s};
  return {m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m)};
}

// y = exp(x - m) / s, or x - m - log(s), from a row's final state.
template <class T, class C, class Acc>
struct RowOutput {
  C m, fin;  // fin: 1 / s, or log(s)
  bool log;
  __device__ RowOutput(MaxSum<C, Acc> st, bool log_)
      : m(st.m), fin(log_ ? static_cast<C>(std::log(st.s)) : static_cast<C>(Acc(1) / st.s)), log(log_) {}
  __device__ T operator()(T x) const {
    const C v = static_cast<C>(x) - m;
    return log ? convert<T>(v - fin) : convert<T>(std::exp(v) * fin);
  }
};

// Rows along x (blockDim.x threads each, a power of two), blockDim.y rows per block.
template <class T>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  using State = MaxSum<C, Acc>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  State* smem = reinterpret_cast<State*>(smem_bytes);
  const int64_t groups = (rows + blockDim.y - 1) / blockDim.y;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // uniform across the block
    const int64_t row = g * blockDim.y + threadIdx.y;
    const bool live = row < rows;
    State st{math::lowest<C>(), Acc(0)};
    if (live) {
      const T* xr = x + row * n;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st = push(st, static_cast<C>(xr[i]));
    }
    st = rd::block_reduce_x(st, [](State a, State b) { return merge(a, b); }, smem);
    if (live) {
      const RowOutput<T, C, Acc> out(st, log);
      const T* xr = x + row * n;
      T* yr = y + row * n;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = out(xr[i]);
    }
  }
}

// Columns (outer index, inner index) along x, the softmax dim split along y.
template <class T>
__global__ void __launch_bounds__(rd::kBlockThreads)
    softmax_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner, bool log) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  using State = MaxSum<C, Acc>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  State* smem = reinterpret_cast<State*>(smem_bytes);
  const int64_t cols = outer * inner, groups = (cols + blockDim.x - 1) / blockDim.x;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // uniform across the block
    const int64_t col = g * blockDim.x + threadIdx.x;
    const bool live = col < cols;
    const int64_t base = live ? (col / inner) * n * inner + col % inner : 0;
    State st{math::lowest<C>(), Acc(0)};
    if (live)
      for (int64_t i = threadIdx.y; i < n; i += blockDim.y) st = push(st, static_cast<C>(x[base + i * inner]));
    st = rd::block_reduce_y(st, [](State a, State b) { return merge(a, b); }, smem);
    if (live) {
      const RowOutput<T, C, Acc> out(st, log);
      for (int64_t i = threadIdx.y; i < n; i += blockDim.y) y[base + i * inner] = out(x[base + i * inner]);
    }
  }
}

}  // namespace

template <class T>
cudaError_t softmax(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner, bool log) {
  using State = MaxSum<compute_t<T>, math::acc_t<T>>;
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  int bx, by;
  size_t smem;
  int64_t groups;
  if (inner == 1) {
    bx = n <= kWarpRowMax ? rd::pow2_at_least(rd::ceil_div(n, 4), 32) : rd::pow2_at_least(rd::ceil_div(n, 8), kMaxRowThreads);
    by = bx < rd::kBlockThreads ? rd::kBlockThreads / bx : 1;
    smem = static_cast<size_t>(bx > 32 ? by * bx / 32 : 0) * sizeof(State);
    groups = rd::ceil_div(outer, by);
  } else {
    const int64_t cols = outer * inner;
    bx = rd::pow2_at_least(cols, 32);
    by = rd::pow2_at_least(rd::ceil_div(n, 4), rd::kBlockThreads / bx);
    if (bx * by < rd::kBlockThreads) bx = rd::pow2_at_least(cols, rd::kBlockThreads / by);
    smem = static_cast<size_t>(bx * by) * sizeof(State);
    groups = rd::ceil_div(cols, bx);
  }
  const unsigned grid = static_cast<unsigned>(std::min(groups, rd::kMaxGridX));
  if (inner == 1) softmax_rows<<<grid, dim3(bx, by), smem, s>>>(x, y, outer, n, log);
  else softmax_cols<<<grid, dim3(bx, by), smem, s>>>(x, y, outer, n, inner, log);
  return cudaGetLastError();
}

// Explicit instances: the floating dtypes.
#define STRATA_SOFTMAX(T) template cudaError_t softmax<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int64_t, bool);
STRATA_SOFTMAX(Half)
STRATA_SOFTMAX(BFloat16)
STRATA_SOFTMAX(float)
STRATA_SOFTMAX(double)
#undef STRATA_SOFTMAX

}  // namespace strata::cuda_kernels
