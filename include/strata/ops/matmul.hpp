// Matrix products with PyTorch's semantics: matmul (1-d, 2-d and batched N-d with
// broadcast batch dims), mm (2-d only) and bmm (3-d, equal batches).
#pragma once

#include <strata/core/tensor.hpp>

namespace strata {

/// The product of a and b, by their dims:
///   (k) x (k) -> ()            dot product, a 0-d tensor
///   (m, k) x (k) -> (m)        matrix-vector
///   (k) x (k, n) -> (n)        vector-matrix
///   (m, k) x (k, n) -> (m, n)
///   (..., m, k) x (..., k, n) -> (..., m, n)   batch dims broadcast; a 1-d operand gets a
///                                              dim of 1 added (then removed from the result)
/// Dtypes promote as in binary ops; bool is not supported. Transposed and other views
/// whose rows or columns are unit-stride are read in place, without a copy.
STRATA_API Tensor matmul(const Tensor& a, const Tensor& b);

/// (m, k) x (k, n) -> (m, n); both must be 2-d.
STRATA_API Tensor mm(const Tensor& a, const Tensor& b);

/// (b, m, k) x (b, k, n) -> (b, m, n); both must be 3-d with the same batch size.
STRATA_API Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace strata
