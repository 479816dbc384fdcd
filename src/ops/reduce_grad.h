// Shared by the reductions' backward: a gradient of the reduced shape, put back in the
// input's rank (the reduced dims re-inserted as size 1) so it broadcasts against the input.
#pragma once

#include <vector>

#include <strata/autograd/graph.hpp>
#include <strata/core/tensor.hpp>

namespace strata::detail {

// dims: normalized and sorted, as reduce_dims() returns them.
inline Tensor unreduce(const Tensor& g, const std::vector<int64_t>& dims, bool keepdim) {
  if (keepdim) return g;
  Tensor r = g;
  for (int64_t d : dims) r = r.unsqueeze(d);
  return r;
}

}  // namespace strata::detail
