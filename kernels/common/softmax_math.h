// Per-element math of the softmax gradients and the causal mask, shared by the CPU and CUDA
// kernels. With y the forward's output and g the gradient of the loss in y, along one row:
//   softmax:      dx_j = y_j (g_j - sum_k g_k y_k)
//   log_softmax:  dx_j = g_j - exp(y_j) sum_k g_k
// `total` is the row's sum (of g y, or of g) in the accumulation type.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"
#include "vec_exp.h"

namespace strata::math {

// One element's part of its row's total: g y, or g for log_softmax.
template <class C>
STRATA_HOST_DEVICE C softmax_grad_term(C y, C g, bool log) {
  return log ? g : g * y;
}

template <class C, class Acc>
STRATA_HOST_DEVICE C softmax_grad(C y, C g, Acc total) {
  return y * (g - static_cast<C>(total));
}

template <class C, class Acc>
STRATA_HOST_DEVICE C log_softmax_grad(C y, C g, Acc total) {
  return g - fast_exp(y) * static_cast<C>(total);  // std::exp of a float is a scalar call
}

// The elements of row `row` that a causal softmax keeps: the rows are the (L, S) matrices'
// rows in order, and row i of each keeps columns j <= i (the top-left triangle that
// scaled_dot_product_attention's is_causal masks by, as PyTorch's does). 0: no mask.
STRATA_HOST_DEVICE int64_t causal_row_length(int64_t row, int64_t causal_rows, int64_t n) {
  if (causal_rows <= 0) return n;
  const int64_t keep = row % causal_rows + 1;
  return keep < n ? keep : n;
}

}  // namespace strata::math
