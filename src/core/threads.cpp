// CPU thread count: OpenMP's, set for the whole process.
#include <omp.h>

#include <strata/core/error.hpp>
#include <strata/core/threads.hpp>

namespace strata {

void set_num_threads(int n) {
  STRATA_CHECK(n >= 1, "[set_num_threads] thread count must be at least 1, got {}", n);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace strata
