// The FMA loop and the memcpy loop behind bench::Ceiling. The FMA loop keeps 12
// independent accumulator chains per thread, more than FMA latency x FMA ports on current
// x86 cores, so it runs at the issue rate: cores x FMA units x vector width x 2 x clock.
#include "machine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <omp.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace bench {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
constexpr const char* kIsa = "AVX-512";
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float first(Vec v) { return _mm512_cvtss_f32(v); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
constexpr const char* kIsa = "AVX2";
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float first(Vec v) { return _mm256_cvtss_f32(v); }
#else
using Vec = float;
constexpr int kLanes = 1;
constexpr const char* kIsa = "scalar";
inline Vec splat(float x) { return x; }
inline Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
inline float first(Vec v) { return v; }
#endif

constexpr int kChains = 12;

volatile float g_sink;  // keeps the loop's result alive

// 2 * kLanes * kChains FLOP per iteration; the empty asm keeps every chain in a register.
__attribute__((noinline)) float fma_chains(int64_t iters) {
  const Vec b = splat(0.999999f), c = splat(1e-7f);
  Vec a0 = splat(1.00f), a1 = splat(1.01f), a2 = splat(1.02f), a3 = splat(1.03f), a4 = splat(1.04f),
      a5 = splat(1.05f), a6 = splat(1.06f), a7 = splat(1.07f), a8 = splat(1.08f), a9 = splat(1.09f),
      a10 = splat(1.10f), a11 = splat(1.11f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = fma(a0, b, c), a1 = fma(a1, b, c), a2 = fma(a2, b, c), a3 = fma(a3, b, c);
    a4 = fma(a4, b, c), a5 = fma(a5, b, c), a6 = fma(a6, b, c), a7 = fma(a7, b, c);
    a8 = fma(a8, b, c), a9 = fma(a9, b, c), a10 = fma(a10, b, c), a11 = fma(a11, b, c);
#if defined(__AVX512F__) || defined(__AVX2__)
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),
                     "+v"(a9), "+v"(a10), "+v"(a11));
#endif
  }
  return first(a0) + first(a1) + first(a2) + first(a3) + first(a4) + first(a5) + first(a6) + first(a7) +
         first(a8) + first(a9) + first(a10) + first(a11);
}

}  // namespace

Ceiling measure_fma_peak(int threads) {
  const int64_t iters = 20'000'000;  // about 0.2 s per run on a 3 GHz AVX-512 core
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    float sink = 0;
    double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += fma_chains(iters);
    double t = now() - t0;
    g_sink = sink;
    best = std::max(best, 2.0 * kLanes * kChains * static_cast<double>(iters) * threads / t * 1e-9);
  }
  return {best, fmt::format("{} threads x {} independent {}-bit {} FMA chains, best of 5 runs", threads, kChains,
                            kLanes * 32, kIsa)};
}

Ceiling measure_memcpy_bandwidth(int threads, int64_t bytes) {
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 0);
  double best = 0;
  for (int run = 0; run < 7; ++run) {
    double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      int64_t n = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t per = (bytes + n - 1) / n, begin = std::min(bytes, t * per), end = std::min(bytes, begin + per);
      std::memcpy(dst.data() + begin, src.data() + begin, static_cast<size_t>(end - begin));
    }
    double t = now() - t0;
    if (run > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / t * 1e-9);  // run 0 faults pages in
  }
  return {best, fmt::format("memcpy of {} MiB on {} threads, read + write bytes, best of 6 runs", bytes >> 20,
                            threads)};
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown";
}

void restart_with_bench_env(char** argv, int threads) {
  if (std::getenv("STRATA_BENCH_RESTARTED")) return;
  setenv("STRATA_BENCH_RESTARTED", "1", 1);
  const std::string t = std::to_string(threads);
  setenv("OMP_NUM_THREADS", t.c_str(), 0);  // 0: a value the user set is kept
  setenv("OPENBLAS_NUM_THREADS", t.c_str(), 0);
  const bool tune = !std::getenv("STRATA_BENCH_GLIBC_DEFAULTS") && !std::getenv("MALLOC_MMAP_MAX_") &&
                    !std::getenv("MALLOC_TRIM_THRESHOLD_");
  if (tune) {
    setenv("MALLOC_MMAP_MAX_", "0", 1);
    setenv("MALLOC_TRIM_THRESHOLD_", "17179869184", 1);
  }
  execv("/proc/self/exe", argv);  // returns only on failure; then carry on as we are
  if (tune) {  // glibc never read them: the header must not say they are in force
    unsetenv("MALLOC_MMAP_MAX_");
    unsetenv("MALLOC_TRIM_THRESHOLD_");
  }
}

std::string malloc_policy() {
  const char* mmap_max = std::getenv("MALLOC_MMAP_MAX_");
  const char* trim = std::getenv("MALLOC_TRIM_THRESHOLD_");
  if (!mmap_max && !trim) return "glibc defaults (large blocks are fresh pages each time; Note [Fresh pages])";
  return fmt::format("glibc keeps freed memory (MALLOC_MMAP_MAX_={}, MALLOC_TRIM_THRESHOLD_={}; Note [Fresh pages])",
                     mmap_max ? mmap_max : "default", trim ? trim : "default");
}

}  // namespace bench
