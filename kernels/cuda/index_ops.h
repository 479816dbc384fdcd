// Entry points of the CUDA indexing, ordering, triangular-mask and dropout kernels, callable
// from plain C++ (src/ops/cuda/index.cpp, sort.cpp, dropout.cpp). Each returns the first
// failed CUDA call's cudaError_t. Offsets and strides are in elements; loops are StridedLoops
// (kernels/common/strided_loop.h) built by the launcher. Kernels that only move elements
// (gather, scatter) are instantiated per element size (T = uint8_t ... uint64_t, the bits
// of any dtype of that size); kernels that compute are instantiated per storage type.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/strided_loop.h"

namespace strata::cuda_kernels {

/// Temporary device memory for an entry point that needs it: the launcher hands out blocks
/// from the caching allocator on the launch's stream and keeps them until the call returns
/// (stream order makes their reuse safe). Raises (a C++ exception) when out of memory.
struct Scratch {
  void* (*alloc)(void* ctx, size_t bytes);
  void* ctx;
  void* get(size_t bytes) const { return alloc(ctx, bytes); }
};

// ---- index validation (kernels/cuda/index.cu) ----

/// Finds the first position of `loop` (one operand, the index) whose value is outside
/// [0, size) and writes {position, value} into result[0..1] (device memory), or {-1, 0} when
/// every value is in range. The caller copies `result` back (which synchronizes).
template <class I>
cudaError_t find_bad_index(const StridedLoop<1>& loop, cudaStream_t s, const I* index, int64_t size,
                           int64_t* result);

// ---- gather and scatter (kernels/cuda/index.cu); I is int32_t or int64_t ----

/// out[o] = x[xo + index[io] * x_dim_stride] over `loop` with operands (out, x, index); x's
/// stride along the indexed dim is 0 in the loop and applied through the index.
template <class T, class I>
cudaError_t gather(const StridedLoop<3>& loop, cudaStream_t s, T* out, const T* x, const I* index,
                   int64_t x_dim_stride);

/// The indexed dim of a scatter: the index's extent along it and each operand's stride.
struct ScatterDim {
  int64_t size;
  int64_t self, index, src;
};

/// self[so + index[io] * d.self] = src[co] where a later position along the dim wins over an
/// earlier one that hits the same element, as on the CPU. `outer` walks (self, index, src)
/// with the dim of size 1; `full` walks them over the index's whole shape with self's stride
/// along the dim set to 0. self_extent is one past the largest offset of self (it sizes the
/// sort that orders colliding writes), or -1 when self has a negative stride.
template <class T, class I>
cudaError_t scatter(const StridedLoop<3>& outer, const StridedLoop<3>& full, const ScatterDim& d, cudaStream_t s,
                    T* self, const I* index, const T* src, int64_t self_extent, const Scratch& scratch);

/// self[so + index[io] * self_dim_stride] += alpha * src[co] over `full` (as for scatter).
/// By default with atomic adds: values that hit one element are summed in no fixed order, so
/// float results may differ in the last bits from run to run. With `deterministic` (and
/// self_extent >= 0) float adds are sorted by destination and each element's values summed in
/// order along the dim, as on the CPU. A = compute_t<T>.
template <class T, class I, class A>
cudaError_t scatter_add(const StridedLoop<3>& full, cudaStream_t s, T* self, const I* index, const T* src,
                        int64_t self_dim_stride, A alpha, bool deterministic, int64_t self_extent,
                        const Scratch& scratch);

// ---- tril / triu (kernels/cuda/triangular.cu) ----

/// The matrix dims of a tril / triu: sizes and the strides of the input and the output.
struct MatrixDims {
  int64_t rows, cols;
  int64_t x_row, x_col, out_row, out_col;
};

/// Keeps (i, j) when j - i <= diagonal (lower) or j - i >= diagonal (upper), else 0;
/// `batch` walks the leading dims with operands (out, x).
template <class T>
cudaError_t triangular(const StridedLoop<2>& batch, const MatrixDims& m, int64_t diagonal, bool upper,
                       cudaStream_t s, T* out, const T* x);

// ---- dropout (kernels/cuda/dropout.cu) ----

/// As cpu::dropout (kernels/cpu/dropout.h) on contiguous arrays, with the same Philox
/// stream: element i is kept when uniform_at(seed, offset, i) >= p, and scaled by `scale`.
/// A non-null `state` replaces seed and offset by state[0], state[1], read on the device (a
/// CUDA graph refills them before each replay).
template <class T>
cudaError_t dropout(int64_t n, cudaStream_t s, const T* x, T* y, T* mask, float p, double scale, uint64_t seed,
                    uint64_t offset, const uint64_t* state = nullptr);

// ---- sort and topk (kernels/cuda/sort.cu) ----

/// One slice per position of `outer` (operands x, values, indices); along the dim a slice
/// has n elements at strides x_stride, v_stride, i_stride.
struct SliceDim {
  int64_t n;
  int64_t x_stride, v_stride, i_stride;
};

/// Orders each slice as cpu::sort_slices does (stable; NaN above every number; descending
/// keeps equal values in position order) and writes its first k entries (k = n: a sort).
template <class T>
cudaError_t sort_slices(const StridedLoop<3>& outer, const SliceDim& d, int64_t k, bool descending,
                        cudaStream_t s, const T* x, T* values, int64_t* indices, const Scratch& scratch);

}  // namespace strata::cuda_kernels
