// Closed-form FLOP counts of the ops that dominate training, from the shapes a kernel receives
// (a multiply-add counts 2, as in torch.utils.flop_counter). Other ops count 0.
#pragma once

#include <strata/core/registry.hpp>

namespace strata::profiler::detail {

double kernel_flops(OpId op, const KernelCall& call);

}  // namespace strata::profiler::detail
