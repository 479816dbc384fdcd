// The profiler, after torch.profiler: a session records one event per kernel that runs
// (every op's compute passes through run_kernel) and one per user range, on every thread, with
// optional input shapes, FLOP estimates, memory and, for ops on CUDA tensors, device time from
// CUDA events; results come as raw events, per-name averages with a table, or a Chrome trace.
//
//   st::profiler::Profiler prof({.record_shapes = true, .with_flops = true});
//   {
//     st::profiler::ProfileScope scope(prof);        // start() ... stop()
//     STRATA_RECORD_FUNCTION("forward");
//     loss = model(x);
//   }
//   std::puts(prof.key_averages().table("self_cpu_time_total", 10).c_str());
//   prof.export_chrome_trace("trace.json");
//
// Without an active session the cost is one atomic load per op and per user range.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/device.hpp>
#include <strata/core/dtype.hpp>
#include <strata/core/export.hpp>
#include <strata/core/registry.hpp>
#include <strata/core/shape.hpp>
#include <strata/profiler/events.hpp>
#include <strata/profiler/schedule.hpp>

namespace strata::nn {
class Module;
}

namespace strata::profiler {

namespace detail {
struct ModuleRanges;
}

enum class ProfilerActivity { CPU, CUDA };

class Profiler;
class RecordFunction;

struct ProfilerOptions {
  /// CPU: host time of every op and range (always recorded). CUDA: device time of ops on CUDA
  /// tensors, from CUDA events recorded on the op's stream around its kernel.
  std::vector<ProfilerActivity> activities = {ProfilerActivity::CPU};
  bool record_shapes = false;   ///< input shapes and dtypes of each op
  bool profile_memory = false;  ///< bytes of storage each op allocates and frees
  bool with_flops = false;      ///< FLOP estimates of matmul, linear, conv2d and attention
  bool emit_nvtx = false;       ///< an NVTX range around each op and range (CUDA builds only)
  /// A range "nn.Module: <name>" around each module call (through a call operator), enclosing its
  /// ops: <name> is the dotted name from a root given to record_modules, else the class name.
  bool with_modules = false;
  /// Drives recording through step(); without one, everything from start() to stop() is one trace.
  std::optional<Schedule> schedule;
  /// Called with the profiler when a trace is complete: at the end of each active cycle of the
  /// schedule, or at stop() when recording.
  std::function<void(Profiler&)> on_trace_ready;
};

/// A profiling session. Only one may be running in the process at a time.
class STRATA_API Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();  ///< stops a running session (without raising)
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Starts the session; raises Error when this or another Profiler is already running, or when
  /// emit_nvtx is asked for in a build without CUDA.
  void start();
  /// Stops it; a trace being recorded is completed (and on_trace_ready called).
  void stop();
  /// Marks the end of a training step: advances the schedule and wraps each recorded step in a
  /// "ProfilerStep#<n>" range, as torch.profiler does.
  void step();

  bool is_running() const { return running_; }
  /// What the schedule asks for at the current step (RecordAndSave without a schedule).
  ProfilerAction current_action() const { return action_; }
  int64_t step_num() const { return step_num_; }
  const ProfilerOptions& options() const { return options_; }
  /// Names `root` and every module below it by their dotted names ("nn.Module: Net" for the
  /// root, "nn.Module: layers.0" ...) and records their calls, with_modules or not (modules
  /// outside the tree are then recorded only with with_modules). Modules are known by address:
  /// call it once the model is where it will run (after any move), and again for another root.
  void record_modules(nn::Module& root);

  /// The events of the last completed trace, ordered by start time.
  const std::vector<ProfilerEvent>& events() const { return events_; }
  /// Per-name aggregates of events(); with group_by_input_shape, per name and input shapes
  /// (needs record_shapes).
  KeyAverages key_averages(bool group_by_input_shape = false) const;
  /// Writes events() as Chrome trace-event JSON, atomically (chrome://tracing, Perfetto).
  void export_chrome_trace(const std::string& path) const;

 private:
  void begin_collection();
  void end_collection(bool keep);
  void open_step_range();
  void close_step_range();
  void transition(ProfilerAction from, ProfilerAction to);

  ProfilerOptions options_;
  bool running_ = false;
  bool collecting_ = false;
  ProfilerAction action_ = ProfilerAction::None;
  int64_t step_num_ = 0;
  std::vector<ProfilerEvent> events_;
  std::unique_ptr<RecordFunction> step_range_;  // "ProfilerStep#<n>" while a schedule records
  // the module names and the global module hooks installed while running (module_ranges.cpp)
  std::shared_ptr<detail::ModuleRanges> module_ranges_;
  void install_module_hooks();
  void remove_module_hooks();
};

/// Starts `profiler` for its lifetime (torch's `with profile(...) as prof:`).
class STRATA_API ProfileScope {
 public:
  explicit ProfileScope(Profiler& profiler) : profiler_(profiler) { profiler_.start(); }
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler& profiler_;
};

/// A user range (torch.profiler.record_function): an event named `name` that encloses the ops
/// and ranges run inside its lifetime on the same thread. Costs one atomic load without a session.
class STRATA_API RecordFunction {
 public:
  explicit RecordFunction(std::string_view name);
  ~RecordFunction();
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  std::shared_ptr<void> buffer_;  // the thread's buffer it was opened in; null when inactive
  int64_t id_ = -1;
};

/// True while a session is running (recording or in a schedule's warmup).
STRATA_API bool is_profiling();

}  // namespace strata::profiler

#define STRATA_PROFILER_CONCAT_(a, b) a##b
#define STRATA_PROFILER_CONCAT(a, b) STRATA_PROFILER_CONCAT_(a, b)
/// A user range covering the rest of the enclosing scope.
#define STRATA_RECORD_FUNCTION(name) \
  ::strata::profiler::RecordFunction STRATA_PROFILER_CONCAT(strata_record_function_, __LINE__)(name)
