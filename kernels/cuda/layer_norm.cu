// CUDA layer norm and RMSNorm over the rows of a contiguous (rows, n) array, forward and
// backward, with the math of kernels/cpu/layer_norm.h: two passes per row (the mean, then
// the centred variance), statistics kept per row for the backward. Rows of up to 1024
// elements are held in registers by one warp each; longer rows get a block each and are
// re-read (from L1/L2) for every pass. Sums are in compute_t<T> (float for the 16-bit types
// and float, double for double) and are reduced in a fixed order, so results are
// reproducible. The weight and bias gradients are column sums over rows in two stages
// (per-chunk partials, then the chunks in order), deterministic as well.
#include <type_traits>

#include "../common/convert.h"
#include "grid_stride.cuh"
#include "nn_norm_ops.h"
#include "row_reduce.cuh"

namespace strata::cuda_kernels {

namespace {

constexpr int kRowWarpMax = 1024;     // longest row one warp takes
constexpr int kWarpsPerBlock = 4;     // rows per block on the warp path
constexpr int kRowBlockThreads = 256;  // threads per row on the block path
constexpr int kParamCols = 32;        // columns per block in the parameter-gradient partials
constexpr int kParamRowLanes = 8;     // rows read at once by such a block
constexpr int64_t kMaxGridX = 2147483647;  // blocks in a grid's x dimension (a block per row)

// ---- forward -------------------------------------------------------------------------------

// One warp per row; kItems * 32 >= n, each lane keeping elements lane, lane + 32, ...
template <class T, int kItems>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    ln_forward_warp(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                    compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd, int64_t rows, int n,
                    compute_t<T> eps, bool rms) {
  using C = compute_t<T>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together
  const T* xr = x + row * n;
  C v[kItems];
  C s = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int j = lane + k * kWarpSize;
    v[k] = j < n ? static_cast<C>(xr[j]) : C(0);
    s += v[k];
  }
  const C m = rms ? C(0) : warp_allreduce(s, Plus{}) / static_cast<C>(n);
  C q = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const C d = v[k] - m;
    if (lane + k * kWarpSize < n) q += d * d;
  }
  const C rs = C(1) / std::sqrt(warp_allreduce(q, Plus{}) / static_cast<C>(n) + eps);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
  T* yr = y + row * n;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int j = lane + k * kWarpSize;
    if (j >= n) continue;
    C o = (v[k] - m) * rs;
    if (w) o *= static_cast<C>(w[j]);
    if (b) o += static_cast<C>(b[j]);
    yr[j] = convert<T>(o);
  }
}

// One block per row (n > kRowWarpMax).
template <class T>
__global__ void __launch_bounds__(kRowBlockThreads)
    ln_forward_block(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                     compute_t<T>* __restrict__ mean, compute_t<T>* __restrict__ rstd, int64_t n, compute_t<T> eps,
                     bool rms) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  C m = 0;
  if (!rms) {
    C s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += static_cast<C>(xr[j]);
    m = block_allreduce(s, Plus{}, scratch) / static_cast<C>(n);
  }
  C q = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C d = static_cast<C>(xr[j]) - m;
    q += d * d;
  }
  const C rs = C(1) / std::sqrt(block_allreduce(q, Plus{}, scratch) / static_cast<C>(n) + eps);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
  T* yr = y + row * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    C o = (static_cast<C>(xr[j]) - m) * rs;
    if (w) o *= static_cast<C>(w[j]);
    if (b) o += static_cast<C>(b[j]);
    yr[j] = convert<T>(o);
  }
}

// ---- backward: the input gradient ----------------------------------------------------------

template <class T, int kItems>
__global__ void __launch_bounds__(kWarpSize* kWarpsPerBlock)
    ln_backward_warp(const T* __restrict__ g, const T* __restrict__ x, const compute_t<T>* __restrict__ mean,
                     const compute_t<T>* __restrict__ rstd, const T* __restrict__ w, T* __restrict__ gx, int64_t rows,
                     int n, bool rms) {
  using C = compute_t<T>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const T* gr = g + row * n;
  const T* xr = x + row * n;
  const C m = mean[row], rs = rstd[row];
  C gh[kItems], xh[kItems];
  C sum_gh = 0, sum_ghx = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int j = lane + k * kWarpSize;
    gh[k] = j < n ? static_cast<C>(gr[j]) * (w ? static_cast<C>(w[j]) : C(1)) : C(0);
    xh[k] = j < n ? (static_cast<C>(xr[j]) - m) * rs : C(0);
    sum_gh += gh[k];
    sum_ghx += gh[k] * xh[k];
  }
  const C a = rms ? C(0) : warp_allreduce(sum_gh, Plus{}) / static_cast<C>(n);
  const C c = warp_allreduce(sum_ghx, Plus{}) / static_cast<C>(n);
  T* out = gx + row * n;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int j = lane + k * kWarpSize;
    if (j < n) out[j] = convert<T>(rs * (gh[k] - a - xh[k] * c));
  }
}

template <class T>
__global__ void __launch_bounds__(kRowBlockThreads)
    ln_backward_block(const T* __restrict__ g, const T* __restrict__ x, const compute_t<T>* __restrict__ mean,
                      const compute_t<T>* __restrict__ rstd, const T* __restrict__ w, T* __restrict__ gx, int64_t n,
                      bool rms) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* gr = g + row * n;
  const T* xr = x + row * n;
  const C m = mean[row], rs = rstd[row];
  C sum_gh = 0, sum_ghx = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C gh = static_cast<C>(gr[j]) * (w ? static_cast<C>(w[j]) : C(1));
    sum_gh += gh;
    sum_ghx += gh * ((static_cast<C>(xr[j]) - m) * rs);
  }
  const C a = rms ? C(0) : block_allreduce(sum_gh, Plus{}, scratch) / static_cast<C>(n);
  const C c = block_allreduce(sum_ghx, Plus{}, scratch) / static_cast<C>(n);
  T* out = gx + row * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C gh = static_cast<C>(gr[j]) * (w ? static_cast<C>(w[j]) : C(1));
    const C xh = (static_cast<C>(xr[j]) - m) * rs;
    out[j] = convert<T>(rs * (gh - a - xh * c));
  }
}

// ---- backward: weight and bias gradients ---------------------------------------------------

// Stage 1: block (column tile, chunk) sums rows [chunk * rows_per_chunk, ...) of its 32
// columns; lanes of threadIdx.y take every kParamRowLanes-th row, then add up in order.
template <class T>
__global__ void __launch_bounds__(kParamCols* kParamRowLanes)
    ln_param_partial(const T* __restrict__ g, const T* __restrict__ x, const compute_t<T>* __restrict__ mean,
                     const compute_t<T>* __restrict__ rstd, compute_t<T>* __restrict__ pw,
                     compute_t<T>* __restrict__ pb, int64_t rows, int64_t n, int64_t rows_per_chunk) {
  using C = compute_t<T>;
  __shared__ C sw[kParamRowLanes][kParamCols + 1], sb[kParamRowLanes][kParamCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kParamCols + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  C aw = 0, ab = 0;
  if (col < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kParamRowLanes) {
      const C gv = static_cast<C>(g[r * n + col]);
      if (pw) aw += gv * ((static_cast<C>(x[r * n + col]) - mean[r]) * rstd[r]);
      ab += gv;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || col >= n) return;
  C tw = 0, tb = 0;
#pragma unroll
  for (int k = 0; k < kParamRowLanes; ++k) {
    tw += sw[k][threadIdx.x];
    tb += sb[k][threadIdx.x];
  }
  if (pw) pw[chunk * n + col] = tw;
  if (pb) pb[chunk * n + col] = tb;
}

// Stage 2: each column adds its chunks in order (0 chunks: a zero gradient).
template <class T>
__global__ void ln_param_final(const compute_t<T>* __restrict__ pw, const compute_t<T>* __restrict__ pb,
                               T* __restrict__ gw, T* __restrict__ gb, int64_t chunks, int64_t n) {
  using C = compute_t<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < n; col += stride) {
    C tw = 0, tb = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      if (gw) tw += pw[k * n + col];
      if (gb) tb += pb[k * n + col];
    }
    if (gw) gw[col] = convert<T>(tw);
    if (gb) gb[col] = convert<T>(tb);
  }
}

// Calls f(std::integral_constant<int, kItems>) with the smallest power of two kItems such
// that a warp of kItems elements per lane covers n <= kRowWarpMax.
template <class F>
void with_items(int64_t n, F&& f) {
  if (n <= 32) f(std::integral_constant<int, 1>{});
  else if (n <= 64) f(std::integral_constant<int, 2>{});
  else if (n <= 128) f(std::integral_constant<int, 4>{});
  else if (n <= 256) f(std::integral_constant<int, 8>{});
  else if (n <= 512) f(std::integral_constant<int, 16>{});
  else f(std::integral_constant<int, 32>{});
}

}  // namespace

template <class T>
cudaError_t layer_norm_forward(cudaStream_t stream, const T* x, const T* w, const T* b, T* y, compute_t<T>* mean,
                               compute_t<T>* rstd, int64_t rows, int64_t n, double eps, bool rms) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  if (rows > kMaxGridX) return cudaErrorInvalidValue;
  const auto e = static_cast<compute_t<T>>(eps);
  if (n <= kRowWarpMax) {
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    with_items(n, [&](auto items) {
      ln_forward_warp<T, decltype(items)::value><<<static_cast<unsigned>(blocks), kWarpSize * kWarpsPerBlock, 0,
                                                   stream>>>(x, w, b, y, mean, rstd, rows, static_cast<int>(n), e, rms);
    });
  } else {
    ln_forward_block<T><<<static_cast<unsigned>(rows), kRowBlockThreads, 0, stream>>>(x, w, b, y, mean, rstd, n, e, rms);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t layer_norm_backward_input(cudaStream_t stream, const T* g, const T* x, const compute_t<T>* mean,
                                      const compute_t<T>* rstd, const T* w, T* gx, int64_t rows, int64_t n, bool rms) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  if (rows > kMaxGridX) return cudaErrorInvalidValue;
  if (n <= kRowWarpMax) {
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    with_items(n, [&](auto items) {
      ln_backward_warp<T, decltype(items)::value><<<static_cast<unsigned>(blocks), kWarpSize * kWarpsPerBlock, 0,
                                                    stream>>>(g, x, mean, rstd, w, gx, rows, static_cast<int>(n), rms);
    });
  } else {
    ln_backward_block<T><<<static_cast<unsigned>(rows), kRowBlockThreads, 0, stream>>>(g, x, mean, rstd, w, gx, n, rms);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t layer_norm_backward_params(cudaStream_t stream, const T* g, const T* x, const compute_t<T>* mean,
                                       const compute_t<T>* rstd, T* gw, T* gb, void* partial, int64_t rows,
                                       int64_t n) {
  if (n <= 0 || (!gw && !gb)) return cudaSuccess;
  using C = compute_t<T>;
  const int64_t chunks = layer_norm_param_chunks(rows, n);
  C* pw = gw ? static_cast<C*>(partial) : nullptr;
  C* pb = gb ? static_cast<C*>(partial) + chunks * n : nullptr;
  if (chunks > 0) {
    const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    const dim3 grid(static_cast<unsigned>((n + kParamCols - 1) / kParamCols), static_cast<unsigned>(chunks));
    ln_param_partial<T><<<grid, dim3(kParamCols, kParamRowLanes), 0, stream>>>(g, x, mean, rstd, pw, pb, rows, n,
                                                                              rows_per_chunk);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  ln_param_final<T><<<grid_stride_blocks(n, 256), 256, 0, stream>>>(pw, pb, gw, gb, chunks, n);
  return cudaGetLastError();
}

// Explicit instances for the dtypes the registry uses.
#define STRATA_LAYER_NORM(T)                                                                                     \
  template cudaError_t layer_norm_forward<T>(cudaStream_t, const T*, const T*, const T*, T*, compute_t<T>*,       \
                                             compute_t<T>*, int64_t, int64_t, double, bool);                      \
  template cudaError_t layer_norm_backward_input<T>(cudaStream_t, const T*, const T*, const compute_t<T>*,        \
                                                    const compute_t<T>*, const T*, T*, int64_t, int64_t, bool);   \
  template cudaError_t layer_norm_backward_params<T>(cudaStream_t, const T*, const T*, const compute_t<T>*,       \
                                                     const compute_t<T>*, T*, T*, void*, int64_t, int64_t);
STRATA_LAYER_NORM(Half)
STRATA_LAYER_NORM(BFloat16)
STRATA_LAYER_NORM(float)
STRATA_LAYER_NORM(double)
#undef STRATA_LAYER_NORM

}  // namespace strata::cuda_kernels
