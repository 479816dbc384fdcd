// parallel_for over [begin, end) in chunks of at least `grain` elements, on OpenMP threads.
// Runs inline when the range is small, so tiny ops pay no threading cost.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#include <omp.h>

namespace strata::cpu {

// The process's CPU thread count, which set_num_threads (src/core/threads.cpp) stores; 0 until
// then: OpenMP's default. OpenMP's own setting is per thread, so each thread that runs ops
// takes the count up before its kernels (oneDNN's and Eigen's too) start their teams.
inline std::atomic<int> g_num_threads{0};

inline int num_threads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n == 0) return omp_get_max_threads();
  thread_local int applied = 0;
  if (applied != n && !omp_in_parallel()) {
    omp_set_num_threads(n);
    applied = n;
  }
  return n;
}

// Elementwise work below this many elements is not worth waking a second thread for.
inline constexpr int64_t kDefaultGrain = 32768;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  int64_t n = end - begin;
  if (n <= 0) return;
  int max_threads = omp_in_parallel() ? 1 : num_threads();
  int64_t chunks = std::min<int64_t>(max_threads, (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    f(begin, end);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel num_threads(static_cast<int>(chunks))
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t per = (n + nt - 1) / nt;
    int64_t b = begin + t * per, e = std::min(end, b + per);
    if (b < e) {
      try {
        f(b, e);
      } catch (...) {
#pragma omp critical(strata_parallel_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace strata::cpu
