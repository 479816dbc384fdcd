// CUDA cumsum and cumprod along one dim of a contiguous (outer, n, inner) array, accumulating
// in math::acc_t<T> as the CPU's cpu::scan does (int64 wrapping, double for float32, float for
// the 16-bit floats). When the dim is innermost the whole array is one segmented scan with
// CUB (the key of an element is its row); otherwise threads run along the contiguous inner dim
// (Note [Chunked column scan]).
#include <algorithm>

#include <cub/device/device_scan.cuh>
#include <cuda/std/functional>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include "../common/convert.h"
#include "../common/reduce_ops.h"
#include "reduce_ops.h"

namespace strata::cuda_kernels {

namespace {

// Note [Chunked column scan]
// Each column (outer index, inner index) is scanned by one thread; neighbouring threads take
// neighbouring inner indices, so loads and stores coalesce. With few columns, the dim is cut
// into chunks so that about kScanUnits threads run: the chunks' totals are folded, scanned
// per column (exclusively, in chunk order), and each chunk is then scanned from its carry.
inline constexpr int kThreads = 256;
inline constexpr int64_t kScanUnits = 65536;
inline constexpr int64_t kMinChunk = 64;

template <class T, bool IsProd>
struct ScanStep {
  using Acc = math::acc_t<T>;
  static constexpr Acc kIdentity = IsProd ? Acc(1) : Acc(0);
  __host__ __device__ Acc operator()(const Acc& a, const Acc& b) const {
    return IsProd ? math::wrapping_mul(a, b) : math::wrapping_add(a, b);
  }
};

template <class T>
struct ToAcc {
  __host__ __device__ math::acc_t<T> operator()(const T& v) const {
    return static_cast<math::acc_t<T>>(static_cast<compute_t<T>>(v));
  }
};

template <class T>
struct FromAcc {
  __host__ __device__ T operator()(const math::acc_t<T>& a) const { return convert<T>(a); }
};

struct RowOf {
  int64_t n;
  __host__ __device__ int64_t operator()(int64_t i) const { return i / n; }
};

template <bool IsProd, class T>
cudaError_t scan_rows(cudaStream_t s, T* y, const T* x, int64_t rows, int64_t n, const Scratch& scratch) {
  auto keys = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), RowOf{n});
  auto in = thrust::make_transform_iterator(x, ToAcc<T>{});
  auto out = thrust::make_transform_output_iterator(y, FromAcc<T>{});
  const int64_t total = rows * n;
  size_t bytes = 0;
  cudaError_t err = cub::DeviceScan::InclusiveScanByKey(nullptr, bytes, keys, in, out, ScanStep<T, IsProd>{}, total,
                                                        ::cuda::std::equal_to<>{}, s);
  if (err != cudaSuccess) return err;
  void* tmp = scratch.get(std::max<size_t>(bytes, 1));  // null would ask CUB for the size again
  return cub::DeviceScan::InclusiveScanByKey(tmp, bytes, keys, in, out, ScanStep<T, IsProd>{}, total,
                                             ::cuda::std::equal_to<>{}, s);
}

struct Columns {
  int64_t cols, n, inner, chunk, nchunks;
  __device__ int64_t base(int64_t col) const { return (col / inner) * n * inner + col % inner; }
};

// totals[k * cols + col]: the fold of chunk k of column col.
template <bool IsProd, class T>
__global__ void chunk_totals(Columns c, const T* __restrict__ x, math::acc_t<T>* __restrict__ totals) {
  using Step = ScanStep<T, IsProd>;
  const int64_t units = c.cols * c.nchunks, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t k = u / c.cols, col = u - k * c.cols, base = c.base(col);
    const int64_t end = (k + 1) * c.chunk < c.n ? (k + 1) * c.chunk : c.n;
    math::acc_t<T> acc = Step::kIdentity;
    for (int64_t i = k * c.chunk; i < end; ++i) acc = Step{}(acc, ToAcc<T>{}(x[base + i * c.inner]));
    totals[u] = acc;
  }
}

// Turns each column's chunk totals into the exclusive scan of them (the chunks' carries).
template <bool IsProd, class T>
__global__ void chunk_carries(Columns c, math::acc_t<T>* __restrict__ totals) {
  using Step = ScanStep<T, IsProd>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < c.cols; col += stride) {
    math::acc_t<T> run = Step::kIdentity;
    for (int64_t k = 0; k < c.nchunks; ++k) {
      const math::acc_t<T> t = totals[k * c.cols + col];
      totals[k * c.cols + col] = run;
      run = Step{}(run, t);
    }
  }
}

// Scans chunk k of column col from its carry (none when the dim is one chunk).
template <bool IsProd, class T>
__global__ void chunk_scan(Columns c, const T* __restrict__ x, T* __restrict__ y,
                           const math::acc_t<T>* __restrict__ carries) {
  using Step = ScanStep<T, IsProd>;
  const int64_t units = c.cols * c.nchunks, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t k = u / c.cols, col = u - k * c.cols, base = c.base(col);
    const int64_t end = (k + 1) * c.chunk < c.n ? (k + 1) * c.chunk : c.n;
    math::acc_t<T> acc = carries ? carries[u] : Step::kIdentity;
    for (int64_t i = k * c.chunk; i < end; ++i) {
      acc = Step{}(acc, ToAcc<T>{}(x[base + i * c.inner]));
      y[base + i * c.inner] = FromAcc<T>{}(acc);
    }
  }
}

unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::min<int64_t>((work + kThreads - 1) / kThreads, 65536));
}

template <bool IsProd, class T>
cudaError_t scan_columns(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner,
                         const Scratch& scratch) {
  using Acc = math::acc_t<T>;
  Columns c{outer * inner, n, inner, n, 1};
  if (c.cols < kScanUnits && n > kMinChunk) {
    c.nchunks = std::min((n + kMinChunk - 1) / kMinChunk, (kScanUnits + c.cols - 1) / c.cols);
    c.chunk = (n + c.nchunks - 1) / c.nchunks;
    c.nchunks = (n + c.chunk - 1) / c.chunk;
  }
  const int64_t units = c.cols * c.nchunks;
  Acc* carries = nullptr;
  if (c.nchunks > 1) {
    carries = static_cast<Acc*>(scratch.get(static_cast<size_t>(units) * sizeof(Acc)));
    chunk_totals<IsProd><<<blocks_for(units), kThreads, 0, s>>>(c, x, carries);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    chunk_carries<IsProd, T><<<blocks_for(c.cols), kThreads, 0, s>>>(c, carries);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  chunk_scan<IsProd><<<blocks_for(units), kThreads, 0, s>>>(c, x, y, carries);
  return cudaGetLastError();
}

template <bool IsProd, class T>
cudaError_t scan(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner, const Scratch& scratch) {
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  if (inner == 1) return scan_rows<IsProd>(s, y, x, outer, n, scratch);
  return scan_columns<IsProd>(s, y, x, outer, n, inner, scratch);
}

}  // namespace

template <class T>
cudaError_t cumsum(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner,
                   const Scratch& scratch) {
  return scan<false>(s, y, x, outer, n, inner, scratch);
}

template <class T>
cudaError_t cumprod(cudaStream_t s, T* y, const T* x, int64_t outer, int64_t n, int64_t inner,
                    const Scratch& scratch) {
  return scan<true>(s, y, x, outer, n, inner, scratch);
}

// Explicit instances: int64 (integers and bool are scanned as int64) and the floating dtypes.
#define STRATA_SCAN(T)                                                                                        \
  template cudaError_t cumsum<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int64_t, const Scratch&); \
  template cudaError_t cumprod<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int64_t, const Scratch&);
STRATA_SCAN(int64_t)
STRATA_SCAN(Half)
STRATA_SCAN(BFloat16)
STRATA_SCAN(float)
STRATA_SCAN(double)
#undef STRATA_SCAN

}  // namespace strata::cuda_kernels
