// Profiler sessions: one at a time in the process, driven by start/stop and, with a schedule,
// by step(), which moves between idle, warmup and recording as torch.profiler.profile does.
#include <strata/profiler/profiler.hpp>

#include <algorithm>
#include <atomic>

#include <strata/core/error.hpp>

#include "profiler/collector.h"
#include "profiler/nvtx.h"

namespace strata::profiler {

namespace {

std::atomic<Profiler*> g_owner{nullptr};  // the running session

bool records(ProfilerAction a) { return a == ProfilerAction::Record || a == ProfilerAction::RecordAndSave; }
bool collects(ProfilerAction a) { return a != ProfilerAction::None; }

}  // namespace

const char* action_name(ProfilerAction action) {
  switch (action) {
    case ProfilerAction::None: return "NONE";
    case ProfilerAction::Warmup: return "WARMUP";
    case ProfilerAction::Record: return "RECORD";
    case ProfilerAction::RecordAndSave: return "RECORD_AND_SAVE";
  }
  return "?";
}

void Schedule::check() const {
  STRATA_CHECK(wait >= 0, "[profiler::schedule] wait must be >= 0, got {}", wait);
  STRATA_CHECK(warmup >= 0, "[profiler::schedule] warmup must be >= 0, got {}", warmup);
  STRATA_CHECK(active >= 1, "[profiler::schedule] active must be >= 1, got {}", active);
  STRATA_CHECK(repeat >= 0, "[profiler::schedule] repeat must be >= 0 (0: forever), got {}", repeat);
  STRATA_CHECK(skip_first >= 0, "[profiler::schedule] skip_first must be >= 0, got {}", skip_first);
}

ProfilerAction Schedule::operator()(int64_t step) const {
  if (step < skip_first) return ProfilerAction::None;
  step -= skip_first;
  const int64_t cycle = wait + warmup + active;
  if (repeat > 0 && step / cycle >= repeat) return ProfilerAction::None;
  const int64_t at = step % cycle;
  if (at < wait) return ProfilerAction::None;
  if (at < wait + warmup) return ProfilerAction::Warmup;
  return at < cycle - 1 ? ProfilerAction::Record : ProfilerAction::RecordAndSave;
}

Schedule schedule(int64_t wait, int64_t warmup, int64_t active, int64_t repeat, int64_t skip_first) {
  Schedule s{wait, warmup, active, repeat, skip_first};
  s.check();
  return s;
}

Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)) {
  if (options_.schedule) options_.schedule->check();
}

Profiler::~Profiler() {
  if (!running_) return;
  try {
    stop();
  } catch (...) {
    // a destructor must not throw; stop() only raises for a failing on_trace_ready or device
  }
}

void Profiler::start() {
  STRATA_CHECK(!running_, "[profiler] this Profiler is already running");
  STRATA_CHECK(!options_.emit_nvtx || detail::nvtx_available(),
               "[profiler] emit_nvtx needs a build with CUDA (configure with -DSTRATA_WITH_CUDA=ON)");
  Profiler* none = nullptr;
  STRATA_CHECK(g_owner.compare_exchange_strong(none, this),
               "[profiler] another Profiler session is already running; stop it before starting a new one");
  running_ = true;
  step_num_ = 0;
  events_.clear();
  action_ = options_.schedule ? (*options_.schedule)(0) : ProfilerAction::Record;
  transition(ProfilerAction::None, action_);
  install_module_hooks();
}

void Profiler::stop() {
  if (!running_) return;
  remove_module_hooks();
  close_step_range();
  const bool save = records(action_);
  if (collecting_) end_collection(save);
  running_ = false;
  action_ = ProfilerAction::None;
  g_owner.store(nullptr);
  if (save && options_.on_trace_ready) options_.on_trace_ready(*this);
}

void Profiler::step() {
  STRATA_CHECK(running_, "[profiler] step() on a Profiler that is not running");
  const ProfilerAction from = action_;
  ++step_num_;
  action_ = options_.schedule ? (*options_.schedule)(step_num_) : ProfilerAction::Record;
  close_step_range();
  transition(from, action_);
}

// Note: without a schedule every step records into the one trace that stop() completes.
void Profiler::transition(ProfilerAction from, ProfilerAction to) {
  if (from == ProfilerAction::RecordAndSave) {  // a cycle's last active step has ended
    end_collection(true);
    if (options_.on_trace_ready) options_.on_trace_ready(*this);
  } else if (from == ProfilerAction::Warmup && records(to)) {
    end_collection(false);  // warmup's events are thrown away
  } else if (collects(from) && !collects(to)) {
    end_collection(false);
  }
  if (collects(to) && !collecting_) begin_collection();
  if (collects(to)) open_step_range();
}

void Profiler::begin_collection() {
  const auto& a = options_.activities;
  detail::begin_collection({.record_shapes = options_.record_shapes,
                            .profile_memory = options_.profile_memory,
                            .with_flops = options_.with_flops,
                            .emit_nvtx = options_.emit_nvtx,
                            .device_events = std::find(a.begin(), a.end(), ProfilerActivity::CUDA) != a.end()});
  collecting_ = true;
}

void Profiler::end_collection(bool keep) {
  std::vector<ProfilerEvent> events = detail::end_collection();
  collecting_ = false;
  if (keep) events_ = std::move(events);
}

void Profiler::open_step_range() {
  if (options_.schedule) step_range_ = std::make_unique<RecordFunction>("ProfilerStep#" + std::to_string(step_num_));
}

void Profiler::close_step_range() { step_range_.reset(); }

KeyAverages Profiler::key_averages(bool group_by_input_shape) const {
  STRATA_CHECK(!group_by_input_shape || options_.record_shapes,
               "[profiler] key_averages(group_by_input_shape=true) needs a Profiler with record_shapes");
  return profiler::key_averages(events_, group_by_input_shape);
}

void Profiler::export_chrome_trace(const std::string& path) const { profiler::export_chrome_trace(events_, path); }

ProfileScope::~ProfileScope() {
  try {
    profiler_.stop();
  } catch (...) {
    // a destructor must not throw
  }
}

RecordFunction::RecordFunction(std::string_view name) {
  if (detail::collecting()) id_ = detail::open_range(name, buffer_);
}

RecordFunction::~RecordFunction() {
  if (!buffer_) return;
  try {
    detail::close_range(buffer_, id_);
  } catch (...) {
    // a destructor must not throw (it may run while an error unwinds): the range is lost
  }
}

bool is_profiling() { return detail::collecting(); }

}  // namespace strata::profiler
