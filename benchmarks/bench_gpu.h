// Shared parts of bench_gpu (the GPU benchmark): its settings, the rows of its table, and the
// event timer. Each section (bench_gpu.cpp: copy, elementwise, reductions; bench_gpu_gemm.cpp;
// bench_gpu_train.cpp: AdamW, GPT) appends rows; main prints them as one table and as
// machine-readable RESULT lines, which scripts/gpu-check.sh joins with bench_gpu_torch.py's.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace bench_gpu {

struct Settings {
  int warmup = 5;                     // untimed runs before each row
  int reps = 20;                      // timed runs; a row reports their median
  double scale = 1.0;                 // multiplies the sizes of the memory-bound rows (copy, elementwise, sums, AdamW)
  std::vector<std::string> sections;  // empty: all of kSections
  std::vector<std::string> workloads;  // the train section's (mlp, cnn, resnet50, gpt); empty: all
};

inline const std::vector<std::string> kSections = {"copy", "elementwise", "reduce", "gemm",
                                                   "adamw", "gpt", "gpt_fused", "train"};

struct Row {
  std::string key;     // the id bench_gpu_torch.py prints for the same workload
  std::string what;    // what was measured, for people
  std::string unit;    // GB/s, TFLOP/s or tokens/s; higher is better in every row
  double value = NAN;  // NaN when the row could not run
  std::string note;    // "% of copy", the cuBLASLt comparison, or "unavailable: <why>"
};

struct Context {
  Settings settings;
  double copy_gbps = NAN;  // the memory ceiling, once the copy row has run
  std::vector<Row> rows;
};

/// Median milliseconds of settings.reps calls of `fn` after settings.warmup untimed ones, each
/// call timed by a pair of CUDA events on the current stream (no synchronization in between,
/// so host overhead is hidden whenever the GPU is the bottleneck).
double median_ms(const Settings& settings, const std::function<void()>& fn);

/// Runs `measure`, which returns the row's value; a std::exception (a missing CUDA kernel is a
/// strata::Error) makes the row "unavailable: <message>" instead of ending the benchmark.
void add_row(Context& ctx, Row row, const std::function<double()>& measure);

/// "NN% of copy" for a bandwidth, or empty when the copy row has not run.
std::string percent_of_copy(const Context& ctx, double gbps);

/// Elements for a nominal count under settings.scale (at least 1024).
long long scaled(const Settings& settings, long long nominal);

void run_memory_rows(Context& ctx);    // copy, elementwise, reduce (bench_gpu.cpp)
void run_gemm_rows(Context& ctx);      // bench_gpu_gemm.cpp
void run_training_rows(Context& ctx);  // adamw, gpt, train (bench_gpu_train.cpp)

bool wants(const Settings& settings, const std::string& section);

}  // namespace bench_gpu
