// torch.profiler.schedule: which steps a Profiler skips, warms up on and records. After
// skip_first steps, cycles of `wait` idle steps, `warmup` steps recorded and thrown away (so the
// first recorded step does not carry the cost of starting) and `active` recorded steps; the
// last active step of each cycle completes a trace. `repeat` cycles, or forever when 0.
#pragma once

#include <cstdint>

#include <strata/core/export.hpp>

namespace strata::profiler {

enum class ProfilerAction { None, Warmup, Record, RecordAndSave };

STRATA_API const char* action_name(ProfilerAction action);

struct STRATA_API Schedule {
  int64_t wait = 0;
  int64_t warmup = 0;
  int64_t active = 1;
  int64_t repeat = 0;
  int64_t skip_first = 0;

  /// Raises Error naming the field when a count is negative or active < 1.
  void check() const;
  /// The action for step `step` (0 for the steps before the first step() call).
  ProfilerAction operator()(int64_t step) const;
};

/// torch.profiler.schedule(wait=, warmup=, active=, repeat=, skip_first=), checked.
STRATA_API Schedule schedule(int64_t wait, int64_t warmup, int64_t active, int64_t repeat = 0,
                             int64_t skip_first = 0);

}  // namespace strata::profiler
