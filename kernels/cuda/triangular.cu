// CUDA tril / triu over the last two dims of a batch of matrices, as cpu::triangular
// (kernels/cpu/triangular.h): one thread per element, (row, col) from the flat position,
// the batch offset from the offset calculator of elementwise.cuh.
#include "../common/half.h"
#include "elementwise.cuh"
#include "index_ops.h"

namespace strata::cuda_kernels {

namespace {

template <class T, class Index>
__global__ void triangular_kernel(Index n, OffsetCalc<2, Index> batch, MatrixDims m, int64_t diagonal, bool upper,
                                  T* __restrict__ out, const T* __restrict__ x) {
  const Index step = Index(gridDim.x) * blockDim.x;
  const Index rows = static_cast<Index>(m.rows), cols = static_cast<Index>(m.cols);
  for (Index p = Index(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += step) {
    const Index j = p % cols;
    const Index rest = p / cols;
    const Index i = rest % rows;
    Index off[2];
    batch.get(rest / rows, off);
    const int64_t d = static_cast<int64_t>(j) - static_cast<int64_t>(i);
    const bool keep = upper ? d >= diagonal : d <= diagonal;
    out[off[0] + i * static_cast<Index>(m.out_row) + j * static_cast<Index>(m.out_col)] =
        keep ? x[off[1] + i * static_cast<Index>(m.x_row) + j * static_cast<Index>(m.x_col)] : T(0);
  }
}

int64_t magnitude(int64_t v) { return v < 0 ? -v : v; }

// Whether every offset of both operands stays below 2^31, and every position plus the grid
// stride (at most 2^24, grid_for's cap) too.
bool narrow_offsets_ok(const StridedLoop<2>& batch, const MatrixDims& m) {
  constexpr int64_t kMax = int64_t(1) << 31;
  constexpr int64_t kMaxPositions = kMax - (int64_t(1) << 24);
  if (m.rows >= kMax || m.cols >= kMax || batch.numel >= kMaxPositions / (m.rows * m.cols)) return false;
  if (!fits_int32(batch)) return false;
  int64_t reach[2] = {0, 0};
  for (int k = 0; k < 2; ++k)
    for (int d = 0; d < batch.ndim; ++d) reach[k] += (batch.shape[d] - 1) * magnitude(batch.strides[k][d]);
  reach[0] += (m.rows - 1) * magnitude(m.out_row) + (m.cols - 1) * magnitude(m.out_col);
  reach[1] += (m.rows - 1) * magnitude(m.x_row) + (m.cols - 1) * magnitude(m.x_col);
  return reach[0] < kMax && reach[1] < kMax;
}

}  // namespace

template <class T>
cudaError_t triangular(const StridedLoop<2>& batch, const MatrixDims& m, int64_t diagonal, bool upper,
                       cudaStream_t s, T* out, const T* x) {
  if (batch.numel == 0 || m.rows == 0 || m.cols == 0) return cudaSuccess;
  if (narrow_offsets_ok(batch, m)) {
    const int64_t n = batch.numel * m.rows * m.cols;
    triangular_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<int32_t>(n), make_calc<2, int32_t>(batch), m,
                                                        diagonal, upper, out, x);
  } else {
    const int64_t n = batch.numel * m.rows * m.cols;
    triangular_kernel<<<grid_for(n), kThreads, 0, s>>>(n, make_calc<2, int64_t>(batch), m, diagonal, upper, out, x);
  }
  return cudaGetLastError();
}

template cudaError_t triangular<Half>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t, Half*,
                                      const Half*);
template cudaError_t triangular<BFloat16>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t,
                                          BFloat16*, const BFloat16*);
template cudaError_t triangular<float>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t, float*,
                                       const float*);
template cudaError_t triangular<double>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t,
                                        double*, const double*);
template cudaError_t triangular<int64_t>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t,
                                         int64_t*, const int64_t*);
template cudaError_t triangular<int32_t>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t,
                                         int32_t*, const int32_t*);
template cudaError_t triangular<int8_t>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t,
                                        int8_t*, const int8_t*);
template cudaError_t triangular<uint8_t>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t,
                                         uint8_t*, const uint8_t*);
template cudaError_t triangular<bool>(const StridedLoop<2>&, const MatrixDims&, int64_t, bool, cudaStream_t, bool*,
                                      const bool*);

}  // namespace strata::cuda_kernels
