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

}  // namespace bench
