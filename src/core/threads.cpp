// CPU thread count: OpenMP's, set for the whole process. omp_set_num_threads sets only the
// calling thread's count, so the count is kept in kernels/cpu/parallel.h and each thread that
// runs ops takes it up there (cpu::num_threads).
#include <algorithm>
#include <thread>

#include <strata/core/error.hpp>
#include <strata/core/threads.hpp>

#include "kernels/cpu/parallel.h"

namespace strata {

void set_num_threads(int n) {
  STRATA_CHECK(n >= 1, "[set_num_threads] thread count must be at least 1, got {}", n);
  // OpenMP's runtime crashes or runs out of memory starting hundreds of thousands of threads
  const int most = std::max(1024, 4 * static_cast<int>(std::thread::hardware_concurrency()));
  STRATA_CHECK(n <= most, "[set_num_threads] thread count {} is more than {} (4x the hardware threads, at least 1024)",
               n, most);
  cpu::g_num_threads.store(n, std::memory_order_relaxed);
  cpu::num_threads();
}

int get_num_threads() { return cpu::num_threads(); }

}  // namespace strata
