// The number of CPU threads strata's kernels use (OpenMP), like torch::set_num_threads.
#pragma once

#include <strata/core/export.hpp>

namespace strata {
/// Sets the CPU thread count for subsequent ops on every thread of the process (OpenMP's own
/// setting is per thread); n must be >= 1. Until it is called, OpenMP's default applies
/// (OMP_NUM_THREADS, else the hardware threads).
STRATA_API void set_num_threads(int n);
STRATA_API int get_num_threads();
}  // namespace strata
