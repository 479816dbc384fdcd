// What the reduction ops share: checking and normalising the dims argument, the shape of the
// result, and turning (input, output, dims) into the cpu::ReducePlan the kernels walk.
#pragma once

#include <string_view>
#include <vector>

#include <strata/core/tensor.hpp>
#include <strata/ops/reduce.hpp>

#include "kernels/cpu/reduce.h"

namespace strata::detail {

/// The reduced dims of `x`, sorted and non-negative; an empty list means every dim. Raises
/// Error naming `op` for a dim out of range or given twice.
std::vector<int64_t> reduce_dims(const Tensor& x, const std::vector<int64_t>& dims, std::string_view op);
/// x's shape with the reduced dims removed, or kept as size 1.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);
/// Number of elements each output folds.
int64_t reduced_numel(const Shape& shape, const std::vector<int64_t>& dims);
/// The loop plan for reducing `in` over `dims` into `out` (of reduced_shape, either keepdim).
cpu::ReducePlan make_reduce_plan(const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                                 std::string_view op);
/// Allocates the output and runs `op`'s kernel (dispatched on x's dtype) with params `p`.
Tensor run_reduction(OpId op, const Tensor& x, const ReduceParams& p, DType out_dtype);

}  // namespace strata::detail
