// What a profiling session records: one ProfilerEvent per kernel and per user range, and their
// per-name aggregates (torch's FunctionEvent and key_averages()).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/device.hpp>
#include <strata/core/dtype.hpp>
#include <strata/core/export.hpp>
#include <strata/core/registry.hpp>
#include <strata/core/shape.hpp>

namespace strata::profiler {

enum class EventKind { Op, UserRange };

struct ProfilerEvent {
  std::string name;  ///< the op's name, or the range's
  EventKind kind = EventKind::Op;
  OpId op{};         ///< for kind == Op
  int64_t id = 0;         ///< unique within the trace
  int64_t parent_id = -1; ///< the enclosing op or range on the same thread, or -1
  int depth = 0;          ///< 0 at top level
  int64_t thread_id = 0;  ///< a small number per thread, 1 for the first thread seen by the profiler
  Device device;          ///< where the op ran (ranges: CPU)
  int64_t start_ns = 0;   ///< steady clock, from the start of the trace
  int64_t end_ns = 0;
  int64_t self_ns = 0;    ///< duration minus the durations of the direct children
  std::vector<Shape> input_shapes;  ///< with record_shapes; an undefined input has an empty shape
  std::vector<std::string> input_dtypes;  ///< dtype names ("float32"); "" for an undefined input
  double flops = 0;               ///< with with_flops, for matmul, linear, conv2d and attention
  int64_t allocated_bytes = 0;    ///< with profile_memory: storage allocated for and during the op
  int64_t freed_bytes = 0;        ///< storage freed during the op
  int64_t self_allocated_bytes = 0;  ///< the same less the direct children's
  int64_t self_freed_bytes = 0;
  int64_t device_start_ns = -1;  ///< CUDA ops with the CUDA activity: device timeline, same origin
  int64_t device_end_ns = -1;

  int64_t duration_ns() const { return end_ns - start_ns; }
  bool has_device_time() const { return device_start_ns >= 0; }
  int64_t device_duration_ns() const { return has_device_time() ? device_end_ns - device_start_ns : 0; }
};

/// Aggregates of the events with one name (and input shapes, when grouped by them).
struct EventAverage {
  std::string name;
  std::string input_shapes;  ///< "[[2, 3], [3, 4]]" when grouped by shape, else empty
  int64_t count = 0;
  int64_t cpu_time_total_ns = 0;       ///< sum of durations
  int64_t self_cpu_time_total_ns = 0;  ///< sum of self times
  int64_t device_time_total_ns = 0;
  double flops = 0;
  int64_t allocated_bytes = 0, self_allocated_bytes = 0;
  int64_t freed_bytes = 0, self_freed_bytes = 0;

  double cpu_time_avg_ns() const { return count ? double(cpu_time_total_ns) / double(count) : 0; }
  double self_cpu_time_avg_ns() const { return count ? double(self_cpu_time_total_ns) / double(count) : 0; }
  /// FLOPs per second of CPU time, in units of 1e9.
  double gflops_per_second() const { return cpu_time_total_ns ? flops / double(cpu_time_total_ns) : 0; }
};

class STRATA_API KeyAverages {
 public:
  KeyAverages(std::vector<EventAverage> rows, bool by_shape) : rows_(std::move(rows)), by_shape_(by_shape) {}
  const std::vector<EventAverage>& rows() const { return rows_; }
  /// The row named `name` (the first one, when grouped by shape); raises Error when absent.
  const EventAverage& at(std::string_view name) const;

  /// A table as PyTorch prints it: Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time
  /// avg, then CUDA, memory, FLOP and shape columns where they have data, and # of Calls.
  /// sort_by: self_cpu_time_total, cpu_time_total, cpu_time_avg, self_cpu_time_avg, count,
  /// cuda_time_total, flops, cpu_memory_usage, self_cpu_memory_usage (descending); anything else
  /// raises Error. row_limit < 0 prints every row.
  std::string table(std::string_view sort_by = "self_cpu_time_total", int row_limit = 100) const;

 private:
  std::vector<EventAverage> rows_;
  bool by_shape_;
};

/// Aggregates `events` per name (and input shapes).
STRATA_API KeyAverages key_averages(const std::vector<ProfilerEvent>& events, bool group_by_input_shape);

/// Writes `events` as Chrome trace-event JSON to `path`, atomically.
STRATA_API void export_chrome_trace(const std::vector<ProfilerEvent>& events, const std::string& path);

}  // namespace strata::profiler
