// Library-internal helpers of Note [In-place under autograd] (src/autograd/inplace.cpp).
#pragma once

#include <functional>

#include <strata/core/tensor.hpp>

namespace strata::autograd::detail {

/// record_inplace for an op that overwrites self with values of its own (fill_, the random
/// draws): `write` fills a new tensor shaped as self, and the old value gets no gradient.
Tensor& record_overwrite(Tensor& self, const char* op, const std::function<void(Tensor& out)>& write);

}  // namespace strata::autograd::detail
