// Indexed reads and writes along one dim (index_select, gather, scatter, scatter_add,
// index_add), one_hot, and the triangular masks tril / triu. Names, argument order and shape
// rules follow PyTorch. Index tensors are int64 or int32; every index value is checked
// against the size of the dim it addresses before anything is written, and negative
// indices are rejected (they do not wrap).
#pragma once

#include <cstdint>

#include <strata/core/tensor.hpp>

namespace strata {

/// Parameters of the index_select, gather, scatter, scatter_add and index_add kernels
/// (dim already normalized; alpha scales the added values of index_add).
struct IndexParams {
  int64_t dim = 0;
  Scalar alpha = 1;
};
/// Parameters of the tril / triu kernels.
struct TriangularParams {
  int64_t diagonal = 0;
};

/// The slices x[..., index[i], ...] along `dim`, for a 1-d (or 0-d) index: the result has x's
/// shape with dim `dim` of size index.numel().
STRATA_API Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (likewise for other dims). index has x's
/// number of dims and no larger a size than x in every dim but `dim`; out has index's shape.
STRATA_API Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

/// A copy of x with self[index[i][j][k]][j][k] = src[i][j][k] for dim 0 (likewise for other
/// dims). When an index repeats, the value of the last position along `dim` wins.
STRATA_API Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// As scatter, writing one value everywhere the index points.
STRATA_API Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, Scalar value);
/// A copy of x with self[index[i][j][k]][j][k] += src[i][j][k] for dim 0. Repeated indices
/// accumulate, on the CPU in order along `dim`, so the result is deterministic. On CUDA the
/// adds are atomic and their order is not fixed unless cuda::set_deterministic(true): with
/// repeated indices, floating results may differ in the last bits from run to run (integer
/// results do not).
STRATA_API Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// A copy of x with x[..., index[i], ...] += alpha * src[..., i, ...] along `dim`, for a 1-d
/// (or 0-d) index; src has x's shape with dim `dim` of size index.numel(). On CUDA repeated
/// indices accumulate as for scatter_add.
STRATA_API Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha = 1);

/// In-place forms: write into `self` and return it. src must have self's dtype. On bad
/// input they raise Error and leave self unchanged.
STRATA_API Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
STRATA_API Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, Scalar value);
STRATA_API Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
STRATA_API Tensor& index_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha = 1);

/// int64 tensor of shape indices.shape + {num_classes} with a 1 at each index. num_classes
/// = -1 takes the largest index plus one (which needs a non-empty input).
STRATA_API Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);

/// The lower (tril) / upper (triu) triangle of the last two dims, batched over the rest:
/// element (i, j) is kept when j - i <= diagonal (tril) or j - i >= diagonal (triu).
STRATA_API Tensor tril(const Tensor& x, int64_t diagonal = 0);
STRATA_API Tensor triu(const Tensor& x, int64_t diagonal = 0);

/// The coordinates of the nonzero (true) elements, one row each in row-major order: int64 of
/// shape (count, dim). Waits for the count (on a GPU, a device-to-host copy).
STRATA_API Tensor nonzero(const Tensor& x);
/// The elements of x where mask (bool, broadcast with x) is true, in row-major order, as a 1-d
/// tensor; differentiable with respect to x.
STRATA_API Tensor masked_select(const Tensor& x, const Tensor& mask);

}  // namespace strata
