// What the machine can do at most, measured rather than looked up: the fp32 FMA rate of
// all threads and the memcpy bandwidth. Benchmarks quote their results against these.
#pragma once

#include <cstdint>
#include <string>

namespace bench {

struct Ceiling {
  double value;        // GFLOP/s or GB/s
  std::string method;  // how it was measured, printed beside the figure
};

/// fp32 FLOP/s of `threads` threads running independent chains of vector FMAs.
Ceiling measure_fma_peak(int threads);

/// memcpy bandwidth of `threads` threads over buffers of `bytes`, counting read + write.
Ceiling measure_memcpy_bandwidth(int threads, int64_t bytes);

/// The CPU model from /proc/cpuinfo ("unknown" when unreadable).
std::string cpu_model();

// Note [Fresh pages]
// LibTorch 1.13 has no CPU caching allocator: each tensor is a malloc. glibc serves a block
// above its mmap threshold (32 MiB at most) with a fresh mapping and unmaps it on free, so a
// 64 MiB output is page-faulted in anew at every call: first-touch writes ran at 1.5-2 GB/s on
// these machines against about 30 GB/s into reused memory, and the LibTorch side of every
// 16M-element row timed the page faults more than its kernel. strata's caching allocator
// reuses its blocks. So the benchmarks run with glibc keeping freed memory for reuse
// (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=16 GiB), timing kernels against kernels;
// STRATA_BENCH_GLIBC_DEFAULTS=1 runs without them, as a LibTorch program runs by default.

/// Restarts the program once with what the measurements need, read by the libraries only at
/// load: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS of `threads` (where unset) and the malloc
/// tunables of Note [Fresh pages]. Returns when already restarted, or if the restart failed.
void restart_with_bench_env(char** argv, int threads);

/// What the header says of the malloc setup: the tunables in force, or "glibc defaults".
std::string malloc_policy();

}  // namespace bench
