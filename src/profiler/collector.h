// The recording machinery under Profiler: an op observer installed while a collection runs,
// per-thread buffers of events and stacks of open ops and ranges, and the per-thread storage
// accounting. One collection at a time in the process.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <strata/profiler/events.hpp>

namespace strata::profiler::detail {

struct CollectorConfig {
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_flops = false;
  bool emit_nvtx = false;
  bool device_events = false;  ///< CUDA events around ops on CUDA tensors
};

/// Starts collecting into a fresh trace (the caller makes sure none is running).
void begin_collection(const CollectorConfig& config);
/// Stops collecting and returns the trace's events, ordered by start time (ties: outer first).
/// Ops still open on other threads are left out.
std::vector<ProfilerEvent> end_collection();
/// True while a collection runs: one atomic load.
bool collecting();

/// Opens a user range on the calling thread; `buffer` keeps the thread's buffer for close_range.
/// Returns the range's id, or -1 (and leaves `buffer` null) when nothing is collecting.
int64_t open_range(std::string_view name, std::shared_ptr<void>& buffer);
void close_range(const std::shared_ptr<void>& buffer, int64_t id);

}  // namespace strata::profiler::detail
