// Diagonals: the strided view diagonal, diag (vector to matrix and back) and trace. diagonal
// records its own backward (the gradient written onto the diagonal of zeros, through the
// view itself, so double backward works); diag and trace are composed of it and scatter.
#include <algorithm>

#include <strata/autograd/graph.hpp>
#include <strata/ops/advanced_index.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/reduce.hpp>

#include "autograd/views.h"
#include "core/tensor_internal.h"

namespace strata {

Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  STRATA_CHECK(x.defined(), "[diagonal] input tensor is undefined");
  STRATA_CHECK(x.dim() >= 2, "[diagonal] needs a tensor of at least 2 dims, got {}", x.dim());
  const int64_t d1 = normalize_dim(dim1, x.dim(), "diagonal"), d2 = normalize_dim(dim2, x.dim(), "diagonal");
  STRATA_CHECK(d1 != d2, "[diagonal] dim1 and dim2 must differ, both are {}", d1);
  const int64_t rows = x.size(d1), cols = x.size(d2);
  const int64_t length =
      std::max<int64_t>(0, offset >= 0 ? std::min(rows, cols - offset) : std::min(rows + offset, cols));
  int64_t start = x.storage_offset();
  if (length > 0) start += offset >= 0 ? offset * x.stride(d2) : -offset * x.stride(d1);
  Shape shape;
  Strides strides;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == d1 || d == d2) continue;
    shape.push_back(x.size(d));
    strides.push_back(x.stride(d));
  }
  shape.push_back(length);
  strides.push_back(x.stride(d1) + x.stride(d2));
  Tensor view = detail::make_view(x, shape, strides, start);
  autograd::record("diagonal", {x}, {view}, {},
                   [in = x.shape(), offset, d1, d2](const autograd::Grads& g, const autograd::Saved&) {
                     Tensor out = zeros(in, g[0].options());
                     diagonal(out, offset, d1, d2).copy_(g[0]);
                     return autograd::Grads{out};
                   });
  autograd::detail::track_view(x, view);
  return view;
}

// A 1-d x scattered onto the flattened (n + |offset|)^2 zeros at row * size + column.
Tensor diag(const Tensor& x, int64_t offset) {
  STRATA_CHECK(x.defined(), "[diag] input tensor is undefined");
  STRATA_CHECK(x.dim() == 1 || x.dim() == 2, "[diag] expects a 1-d or 2-d tensor, got {} dims", x.dim());
  if (x.dim() == 2) return diagonal(x, offset, 0, 1).clone();
  const int64_t n = x.size(0), size = n + (offset >= 0 ? offset : -offset);
  const Tensor out = zeros({size * size}, x.options());
  if (n == 0) return out.view({size, size});
  const TensorOptions index_options(kInt64, x.device());
  const Tensor rows = arange(std::max<int64_t>(0, -offset), std::max<int64_t>(0, -offset) + n, 1, index_options);
  const Tensor positions = add(mul(rows, size + 1), offset);  // row * size + (row + offset)
  return scatter(out, 0, positions, x).view({size, size});
}

Tensor trace(const Tensor& x) {
  STRATA_CHECK(x.defined(), "[trace] input tensor is undefined");
  STRATA_CHECK(x.dim() == 2, "[trace] expects a 2-d tensor, got {} dims", x.dim());
  return sum(diagonal(x));
}

}  // namespace strata
