// Softmax variants the library uses internally (src/ops/softmax.cpp).
#pragma once

#include <strata/core/tensor.hpp>

namespace strata::detail {

/// softmax(scores.masked_fill(triu(ones(L, S), 1), -inf), -1) for scores (..., L, S), in one
/// kernel: row i of each (L, S) matrix keeps columns j <= i. Differentiable in scores.
Tensor causal_softmax(const Tensor& scores);

}  // namespace strata::detail
