// Joining tensors (cat, stack) and splitting one into views (split, chunk), with PyTorch's
// rules.
#pragma once

#include <cstdint>
#include <optional>
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

/// x tiled `repeats[d]` times along each dim (x is left-padded with 1-sized dims to as many
/// dims as repeats has), as torch.Tensor.repeat.
STRATA_API Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
/// repeat, with reps left-padded with 1s to x's dims when it has fewer.
STRATA_API Tensor tile(const Tensor& x, const std::vector<int64_t>& reps);
/// Each element repeated `repeats` times in place along `dim` (over the flattened tensor
/// without dim).
STRATA_API Tensor repeat_interleave(const Tensor& x, int64_t repeats, std::optional<int64_t> dim = std::nullopt);
/// The elements in reverse order along each of `dims`.
STRATA_API Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
/// Elements shifted by shifts[i] along dims[i], wrapping around; without dims, over the
/// flattened tensor (one shift), keeping the shape.
STRATA_API Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {});
/// The views x.select(dim, i) for every i.
STRATA_API std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);

}  // namespace strata
