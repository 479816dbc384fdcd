// Ordering along one dim: sort, argsort, topk. NaN orders above every number, as in
// PyTorch; equal values keep their original order, so sort is always stable and topk
// picks the earliest of tied values.
#pragma once

#include <cstdint>
#include <tuple>

#include <strata/core/tensor.hpp>

namespace strata {

/// Parameters of the sort / topk kernels (dim normalized; k = size of the dim for sort).
struct SortParams {
  int64_t dim = 0;
  int64_t k = 0;
  bool descending = false;
};

/// (values, int64 indices) of x sorted along `dim`. `stable` is accepted for PyTorch
/// compatibility; the sort is stable either way.
STRATA_API std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false,
                                           bool stable = true);
/// The int64 indices that sort x along `dim`.
STRATA_API Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = true);
/// (values, int64 indices) of the k largest (or smallest) entries along `dim`, k in
/// [0, x.size(dim)]. They come in order (largest first when largest) whether or not `sorted`
/// is set.
STRATA_API std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                           bool sorted = true);

}  // namespace strata
