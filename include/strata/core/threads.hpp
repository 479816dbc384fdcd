// The number of CPU threads strata's kernels use (OpenMP), like torch::set_num_threads.
#pragma once

#include <strata/core/export.hpp>

namespace strata {
/// Sets the CPU thread count for subsequent ops; n must be >= 1.
STRATA_API void set_num_threads(int n);
STRATA_API int get_num_threads();
}  // namespace strata
