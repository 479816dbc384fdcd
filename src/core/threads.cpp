// CPU thread count: OpenMP's, set for the whole process. omp_set_num_threads sets only the
// calling thread's count, so the count is kept here and each thread that runs ops takes it up
// (detail::cpu_threads), before its kernels, oneDNN's and Eigen's included, start their teams.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include <strata/core/error.hpp>
#include <strata/core/threads.hpp>

#include "kernels/cpu/parallel.h"

namespace strata {

namespace {
std::atomic<int> g_num_threads{0};  // 0: not set; OpenMP's default
}  // namespace

namespace detail {
int cpu_threads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n == 0) return omp_get_max_threads();
  thread_local int applied = 0;
  if (applied != n && !omp_in_parallel()) {
    omp_set_num_threads(n);
    applied = n;
  }
  return n;
}
}  // namespace detail

void set_num_threads(int n) {
  STRATA_CHECK(n >= 1, "[set_num_threads] thread count must be at least 1, got {}", n);
  // OpenMP's runtime crashes or runs out of memory starting hundreds of thousands of threads
  const int most = std::max(1024, 4 * static_cast<int>(std::thread::hardware_concurrency()));
  STRATA_CHECK(n <= most, "[set_num_threads] thread count {} is more than {} (4x the hardware threads, at least 1024)",
               n, most);
  g_num_threads.store(n, std::memory_order_relaxed);
  detail::cpu_threads();
}

int get_num_threads() { return detail::cpu_threads(); }

}  // namespace strata
