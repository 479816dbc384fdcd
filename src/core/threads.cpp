// CPU thread count: OpenMP's, set for the whole process.
#include <omp.h>

#include <algorithm>
#include <thread>

#include <strata/core/error.hpp>
#include <strata/core/threads.hpp>

namespace strata {

void set_num_threads(int n) {
  STRATA_CHECK(n >= 1, "[set_num_threads] thread count must be at least 1, got {}", n);
  // OpenMP's runtime crashes or runs out of memory starting hundreds of thousands of threads
  const int most = std::max(1024, 4 * static_cast<int>(std::thread::hardware_concurrency()));
  STRATA_CHECK(n <= most, "[set_num_threads] thread count {} is more than {} (4x the hardware threads, at least 1024)",
               n, most);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace strata
