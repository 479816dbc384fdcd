// Library-internal helpers of Note [In-place under autograd] (src/autograd/inplace.cpp).
#pragma once

#include <functional>

#include <strata/core/tensor.hpp>

namespace strata::autograd::detail {

/// The step record_inplace takes on every path: the result of `out_of_place` on `value` (on a
/// copy of it when `reads_self`), of self's shape, cast to self's dtype, written into self
/// without recording. Returns it, with its history.
Tensor compute_and_write(Tensor& self, const Tensor& value, const char* op, bool reads_self,
                         const std::function<Tensor(const Tensor& value)>& out_of_place);

/// record_inplace for an op that overwrites self with values of its own (fill_, the random
/// draws): `write` fills a new tensor shaped as self, and the old value gets no gradient.
Tensor& record_overwrite(Tensor& self, const char* op, const std::function<void(Tensor& out)>& write);

}  // namespace strata::autograd::detail
