// Joining tensors (cat, stack) and splitting one into views (split, chunk), with PyTorch's
// rules.
#pragma once

#include <cstdint>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata {

/// Concatenates along `dim`. Shapes must agree except in `dim`; the dtype is the promotion
/// of all inputs; all must be on one device. 1-d tensors of shape {0} are skipped, as in
/// PyTorch. Raises Error for an empty list.
STRATA_API Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Joins equally shaped tensors along a new dim `dim` (in [-(ndim+1), ndim]).
STRATA_API Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

/// Views of `split_size` elements along `dim` (the last may be smaller).
STRATA_API std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);
/// Views of the given sizes along `dim`; the sizes must sum to t.size(dim).
STRATA_API std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim = 0);
STRATA_API std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim = 0);
/// At most `chunks` views of ceil(size / chunks) elements along `dim` (fewer when the size
/// does not allow that many; exactly `chunks` empty views when the dim has size 0).
STRATA_API std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);

}  // namespace strata
