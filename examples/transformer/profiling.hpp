// --profile <trace.json>: strata's profiler over a few training steps after warm-up (the first
// steps fill the allocator's caches and are not typical). When they are recorded, their Chrome
// trace is written to the file and the op table printed, sorted by self time.
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include <strata/strata.hpp>

namespace profiling {

namespace prof = strata::profiler;

class StepProfiler {
 public:
  // Does nothing when `path` is empty; `steps` is how many training steps this run takes.
  StepProfiler(const std::string& path, int64_t steps, strata::Device device) {
    if (path.empty()) return;
    const int64_t skip = std::min<int64_t>(5, steps / 2);
    const int64_t warmup = steps - skip >= 2 ? 1 : 0;
    const int64_t active = std::max<int64_t>(1, std::min<int64_t>(3, steps - skip - warmup));
    prof::ProfilerOptions options{.profile_memory = true, .with_flops = true,
                                  .schedule = prof::schedule(0, warmup, active, 1, skip)};
    if (device.is_cuda()) options.activities.push_back(prof::ProfilerActivity::CUDA);
    options.on_trace_ready = [path](prof::Profiler& p) {
      p.export_chrome_trace(path);
      std::printf("profile of ProfilerStep#%lld-#%lld (%zu events), trace written to %s:\n%s",
                  (long long)(p.step_num() - p.options().schedule->active), (long long)(p.step_num() - 1),
                  p.events().size(), path.c_str(), p.key_averages().table("self_cpu_time_total", 15).c_str());
    };
    profiler_ = std::make_unique<prof::Profiler>(std::move(options));
    profiler_->start();
  }

  // After each training step.
  void step() {
    if (profiler_) profiler_->step();
  }
  void stop() {
    if (profiler_) profiler_->stop();
  }

 private:
  std::unique_ptr<prof::Profiler> profiler_;
};

}  // namespace profiling
