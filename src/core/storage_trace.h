// Per-thread accounting of Storage allocations, for the profiler's memory columns. While the
// profiler does not ask for it, an allocation pays one relaxed atomic load. The per-thread
// record is trivially destructible on purpose: storages freed during thread exit may touch it.
#pragma once

#include <atomic>
#include <cstdint>

namespace strata::detail {

struct StorageTrace {
  static constexpr int kRecent = 16;
  int64_t allocated_bytes = 0;  ///< running totals on this thread while enabled
  int64_t freed_bytes = 0;
  const void* recent[kRecent] = {};  ///< the storages allocated last on this thread (a ring)
  int64_t recent_bytes[kRecent] = {};
  int next = 0;

  /// Bytes of `storage` when it is among the recent allocations, which it then leaves (so an
  /// allocation is charged to one op only); 0 otherwise.
  int64_t take_recent(const void* storage) {
    for (int i = 0; i < kRecent; ++i)
      if (recent[i] == storage) {
        recent[i] = nullptr;
        return recent_bytes[i];
      }
    return 0;
  }
};

/// The calling thread's trace.
StorageTrace& storage_trace();
/// Turns the accounting on or off for every thread.
void set_storage_trace_enabled(bool enabled);

}  // namespace strata::detail
