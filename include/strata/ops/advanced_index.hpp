// Advanced indexing (PyTorch's x[i, j] and x[i, j] = v), binary search into a sorted
// sequence (searchsorted, bucketize) and diagonals (diagonal, diag, trace). All are composed
// of index_select, scatter, index_add, sort and strided views, so they run on every device
// and differentiate through the ops they are made of.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata {

/// One index per leading dim of x, as in x[i, j]: an int64 or int32 tensor (negative values
/// count from the end), a bool mask (covering as many dims as it has, which must match x's
/// sizes; it stands for its nonzero() coordinates), or nullopt / an undefined tensor for a
/// whole dim (":"). Dims past the list are whole.
using TensorIndices = std::vector<std::optional<Tensor>>;

/// x[indices] with PyTorch's advanced-indexing rules: the integer indices broadcast together
/// to a shape B; when they address adjacent dims B takes their place, else B comes first and
/// the whole dims follow. A copy; differentiable with respect to x.
STRATA_API Tensor index(const Tensor& x, const TensorIndices& indices);
/// A copy of x with x[indices] = values (values broadcast to the shape index() gives, of x's
/// dtype and device). With accumulate, repeated positions add up; without, the last of them
/// in the row-major order of the broadcast indices wins (on every device). Every index is
/// checked before anything is written. Differentiable: x's gradient is zero where written
/// (kept with accumulate), values' is the gradient at the positions they address.
STRATA_API Tensor index_put(const Tensor& x, const TensorIndices& indices, const Tensor& values,
                            bool accumulate = false);
/// In-place form: writes into self and returns it; on bad input raises Error and leaves self
/// unchanged. Under autograd, self must not be a leaf that requires grad.
STRATA_API Tensor& index_put_(Tensor& self, const TensorIndices& indices, const Tensor& values,
                              bool accumulate = false);

/// For each of `values` (any shape), the int64 position in the ascending 1-d `sorted_sequence`
/// where it would be inserted to keep the order: before equal elements (after them with
/// `right`). NaN values go at the end. The result has values' shape.
STRATA_API Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool right = false);
/// The bucket of each value among ascending 1-d `boundaries`: i with boundaries[i-1] < v <=
/// boundaries[i] (boundaries[i-1] <= v < boundaries[i] with `right`), as torch.bucketize.
STRATA_API Tensor bucketize(const Tensor& values, const Tensor& boundaries, bool right = false);

/// The view of the diagonal of dims dim1 and dim2 (offset > 0 above the main one, < 0 below):
/// those dims are removed and the diagonal becomes the last dim.
STRATA_API Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
/// A 1-d x as the `offset` diagonal of a square matrix of zeros; of a 2-d x, a copy of its
/// `offset` diagonal.
STRATA_API Tensor diag(const Tensor& x, int64_t offset = 0);
/// Sum of the main diagonal of a 2-d x (integers and bool give int64).
STRATA_API Tensor trace(const Tensor& x);

}  // namespace strata
