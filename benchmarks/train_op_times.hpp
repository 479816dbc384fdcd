// Where a strata training step spends its time, op by op, for bench_train's --ops flag: a
// profiler session over the timed steps, printed as self time per op and per op and input
// shapes (an op whose kernel runs others is charged only its own part).
#pragma once

#include <algorithm>
#include <cstdio>
#include <vector>

#include <strata/strata.hpp>

namespace bench {

class OpTimes {
 public:
  OpTimes() : profiler_({.record_shapes = true}) { profiler_.start(); }

  // Stops recording, then prints the `top` most costly ops, then op-with-shapes rows, in ms per step.
  void print(int steps, double step_seconds, int top) {
    profiler_.stop();
    auto rows = [&](const strata::profiler::KeyAverages& averages, const char* what) {
      std::vector<strata::profiler::EventAverage> v = averages.rows();
      std::sort(v.begin(), v.end(),
                [](const auto& a, const auto& b) { return a.self_cpu_time_total_ns > b.self_cpu_time_total_ns; });
      std::printf("  strata kernels by %s (ms per step; step %.1f ms):\n", what, 1e3 * step_seconds / steps);
      for (int i = 0; i < std::min<int>(top, static_cast<int>(v.size())); ++i) {
        const double seconds = 1e-9 * static_cast<double>(v[i].self_cpu_time_total_ns);
        std::printf("    %8.1f ms %5.1f%%  %4lld calls  %s %s\n", 1e3 * seconds / steps, 100 * seconds / step_seconds,
                    (long long)(v[i].count / steps), v[i].name.c_str(), v[i].input_shapes.c_str());
      }
    };
    rows(profiler_.key_averages(), "op");
    rows(profiler_.key_averages(true), "op and input shapes");
  }

 private:
  strata::profiler::Profiler profiler_;
};

}  // namespace bench
