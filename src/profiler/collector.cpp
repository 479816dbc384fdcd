// Recording: an op observer that is installed only while a collection runs (so an idle profiler
// costs run_kernel its one atomic load), one buffer per thread and collection, and a stack of
// the ops and ranges open on each thread, which gives nesting, self time and self memory.
//
// Note [Profiler threads]: a thread finds its buffer through a thread_local shared_ptr checked
// against the running collection's generation number; the first op or range of a thread in a
// collection registers a new buffer under a mutex. Only the owning thread touches a buffer's
// stack; finished events go into its event list under the buffer's own (uncontended) mutex,
// which end_collection takes to read them. A buffer outlives the collection while its thread
// still holds it, so an op that finishes after stop() writes into a buffer nobody reads.
#include "profiler/collector.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>

#include <strata/core/cuda.hpp>
#include <strata/core/tensor.hpp>

#include "core/storage_trace.h"
#include "profiler/flops.h"
#include "profiler/nvtx.h"

namespace strata::profiler::detail {

namespace {

using Clock = std::chrono::steady_clock;
using strata::detail::storage_trace;
using strata::detail::StorageTrace;

struct Frame {
  ProfilerEvent event;
  Clock::time_point start;
  int64_t children_ns = 0, children_allocated = 0, children_freed = 0;
  // of its time and memory, what an enclosing range that closed before it already counted
  int64_t charged_ns = 0, charged_allocated = 0, charged_freed = 0;
  int64_t allocated_at_start = 0, freed_at_start = 0;  // the thread's storage trace totals
  std::optional<cuda::Event> device_start;
};

// CUDA events of one recorded op, turned into device times at the end of the collection.
struct DeviceTiming {
  size_t event;
  cuda::Event start, end;
};

struct ThreadBuffer {
  uint64_t generation = 0;
  CollectorConfig config;
  Clock::time_point origin;
  int64_t thread_id = 0;
  std::vector<Frame> stack;  // its thread's only
  std::mutex mutex;          // guards the two lists below
  std::vector<ProfilerEvent> events;
  std::vector<DeviceTiming> device_timings;
};

// An event recorded on a device's default stream when the collection starts: the device
// timeline's origin, `ns` after the host's.
struct DeviceOrigin {
  int device;
  cuda::Event event;
  int64_t ns;
};

struct Collection {
  uint64_t generation = 0;
  CollectorConfig config;
  Clock::time_point origin;
  std::vector<DeviceOrigin> device_origins;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // guarded by g_mutex
};

std::atomic<uint64_t> g_generation{0};  // of the running collection; 0 when none runs
std::atomic<int64_t> g_next_event_id{0};
std::mutex g_mutex;
std::shared_ptr<Collection> g_collection;  // guarded by g_mutex
uint64_t g_last_generation = 0;            // guarded by g_mutex
thread_local std::shared_ptr<ThreadBuffer> t_buffer;

int64_t this_thread_id() {
  static std::atomic<int64_t> next{1};
  thread_local const int64_t id = next.fetch_add(1);
  return id;
}

int64_t since(Clock::time_point origin, Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin).count();
}

// The calling thread's buffer in the running collection (Note [Profiler threads]), or null.
ThreadBuffer* current_buffer() {
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (generation == 0) return nullptr;
  if (t_buffer && t_buffer->generation == generation) return t_buffer.get();
  std::lock_guard lock(g_mutex);
  if (!g_collection || g_collection->generation != generation) return nullptr;  // it ended meanwhile
  auto buffer = std::make_shared<ThreadBuffer>();
  buffer->generation = generation;
  buffer->config = g_collection->config;
  buffer->origin = g_collection->origin;
  buffer->thread_id = this_thread_id();
  g_collection->buffers.push_back(buffer);
  t_buffer = buffer;
  return buffer.get();
}

Frame new_frame(const ThreadBuffer& b, std::string name, EventKind kind) {
  Frame f;
  f.event.name = std::move(name);
  f.event.kind = kind;
  f.event.id = g_next_event_id.fetch_add(1, std::memory_order_relaxed);
  f.event.parent_id = b.stack.empty() ? -1 : b.stack.back().event.id;
  f.event.depth = static_cast<int>(b.stack.size());
  f.event.thread_id = b.thread_id;
  f.event.device = kCPU;
  return f;
}

// Pushes `f` and starts its clock, last, so that the profiler's own work stays outside it.
void open(ThreadBuffer& b, Frame&& f) {
  b.stack.push_back(std::move(f));
  Frame& top = b.stack.back();
  if (b.config.profile_memory) {
    const StorageTrace& trace = storage_trace();
    top.allocated_at_start = trace.allocated_bytes;
    top.freed_at_start = trace.freed_bytes;
  }
  if (b.config.emit_nvtx) nvtx_push(top.event.name.c_str());
  top.start = Clock::now();
}

// Takes frame `at` (the top, or a range closed before ranges opened inside it) off the stack
// into an event and charges its time and memory to the frame below it.
void close(ThreadBuffer& b, std::optional<cuda::Event> device_end, size_t at) {
  const Clock::time_point end = Clock::now();
  if (b.config.emit_nvtx) nvtx_pop();
  Frame f = std::move(b.stack[at]);
  b.stack.erase(b.stack.begin() + static_cast<std::ptrdiff_t>(at));
  // a range still open above it has had part of its time counted in f's: the frame below
  // gets that part through f, so it is not charged again when that range closes
  if (at < b.stack.size()) {
    Frame& above = b.stack[at];  // a range: a range cannot close while an op above it runs
    above.charged_ns = since(above.start, end);
    if (b.config.profile_memory) {
      above.charged_allocated = storage_trace().allocated_bytes - above.allocated_at_start;
      above.charged_freed = storage_trace().freed_bytes - above.freed_at_start;
    }
    f.children_ns += above.charged_ns;  // so far, it is f's child
    f.children_allocated += above.charged_allocated;
    f.children_freed += above.charged_freed;
  }
  ProfilerEvent& e = f.event;
  e.start_ns = since(b.origin, f.start);
  e.end_ns = since(b.origin, end);
  e.self_ns = e.duration_ns() - f.children_ns;
  if (b.config.profile_memory) {
    const StorageTrace& trace = storage_trace();
    e.allocated_bytes += trace.allocated_bytes - f.allocated_at_start;
    e.freed_bytes = trace.freed_bytes - f.freed_at_start;
    e.self_allocated_bytes = e.allocated_bytes - f.children_allocated;
    e.self_freed_bytes = e.freed_bytes - f.children_freed;
  }
  if (at > 0) {
    Frame& parent = b.stack[at - 1];
    parent.children_ns += e.duration_ns() - f.charged_ns;
    parent.children_allocated += e.allocated_bytes - f.charged_allocated;
    parent.children_freed += e.freed_bytes - f.charged_freed;
  }
  std::lock_guard lock(b.mutex);
  if (f.device_start && device_end) b.device_timings.push_back({b.events.size(), *f.device_start, *device_end});
  b.events.push_back(std::move(e));
}

Device call_device(const KernelCall& call) {  // as run_kernel picks it
  if (!call.outputs.empty() && call.outputs[0].defined()) return call.outputs[0].device();
  if (!call.inputs.empty() && call.inputs[0].defined()) return call.inputs[0].device();
  return kCPU;
}

class Observer final : public OpObserver {
 public:
  void on_begin(OpId op, const KernelCall& call) override {
    ThreadBuffer* b = current_buffer();
    if (!b) return;
    Frame f = new_frame(*b, std::string(op_name(op)), EventKind::Op);
    f.event.op = op;
    f.event.device = call_device(call);
    if (b->config.record_shapes) {
      for (const Tensor& t : call.inputs) {
        f.event.input_shapes.push_back(t.defined() ? t.shape() : Shape{});
        f.event.input_dtypes.emplace_back(t.defined() ? dtype_name(t.dtype()) : "");
      }
    }
    if (b->config.with_flops) f.event.flops = kernel_flops(op, call);
    if (b->config.profile_memory) {
      StorageTrace& trace = storage_trace();  // outputs allocated for this call, just before it
      for (const Tensor& t : call.outputs)
        if (t.defined()) f.event.allocated_bytes += trace.take_recent(t.storage().get());
    }
    if (b->config.device_events && f.event.device.is_cuda()) {
      cuda::Event start(true);
      start.record(cuda::Stream::current(f.event.device.index));
      f.device_start = start;
    }
    open(*b, std::move(f));
  }

  void on_end(OpId op, const KernelCall&) override {
    ThreadBuffer* b = t_buffer.get();
    if (!b || b->stack.empty()) return;
    const ProfilerEvent& top = b->stack.back().event;
    if (top.kind != EventKind::Op || top.op != op) return;  // its begin was not recorded
    // on_end must not throw (it may run while a failing kernel's error unwinds): what fails is lost
    std::optional<cuda::Event> device_end;
    if (b->stack.back().device_start) {
      try {
        device_end.emplace(true);
        device_end->record(cuda::Stream::current(top.device.index));
      } catch (...) {
        device_end.reset();  // the op keeps its host times
      }
    }
    try {
      close(*b, std::move(device_end), b->stack.size() - 1);  // pops the frame before anything that can fail
    } catch (...) {
    }
  }
};

Observer& observer() {
  static Observer* o = new Observer();  // never destroyed: a kernel may still be in it at exit
  return *o;
}

// Device times of `events` from their CUDA events, on the host's time origin.
void resolve_device_times(const Collection& c, ThreadBuffer& b) {
  for (DeviceTiming& t : b.device_timings) {
    ProfilerEvent& e = b.events[t.event];
    auto origin = std::find_if(c.device_origins.begin(), c.device_origins.end(),
                               [&](const DeviceOrigin& o) { return o.device == e.device.index; });
    if (origin == c.device_origins.end()) continue;
    t.end.synchronize();
    const double start_ms = origin->event.elapsed_time(t.start);
    e.device_start_ns = origin->ns + static_cast<int64_t>(start_ms * 1e6);
    e.device_end_ns = e.device_start_ns + static_cast<int64_t>(t.start.elapsed_time(t.end) * 1e6);
  }
}

}  // namespace

bool collecting() { return g_generation.load(std::memory_order_acquire) != 0; }

void begin_collection(const CollectorConfig& config) {
  auto c = std::make_shared<Collection>();
  c->config = config;
  c->origin = Clock::now();
  if (config.device_events) {
    for (int d = 0; d < cuda::device_count(); ++d) {
      cuda::Event e(true);
      e.record(cuda::Stream::default_stream(d));
      c->device_origins.push_back({d, e, since(c->origin, Clock::now())});
    }
  }
  std::lock_guard lock(g_mutex);
  c->generation = ++g_last_generation;
  g_collection = std::move(c);
  strata::detail::set_storage_trace_enabled(config.profile_memory);
  g_generation.store(g_last_generation, std::memory_order_release);
  set_op_observer(&observer());
}

std::vector<ProfilerEvent> end_collection() {
  std::shared_ptr<Collection> c;
  {
    std::lock_guard lock(g_mutex);
    g_generation.store(0, std::memory_order_release);
    set_op_observer(nullptr);
    c = std::move(g_collection);
  }
  strata::detail::set_storage_trace_enabled(false);
  std::vector<ProfilerEvent> events;
  if (!c) return events;
  for (const std::shared_ptr<ThreadBuffer>& b : c->buffers) {
    std::lock_guard lock(b->mutex);
    resolve_device_times(*c, *b);
    std::move(b->events.begin(), b->events.end(), std::back_inserter(events));
    b->events.clear();
    b->device_timings.clear();
  }
  std::sort(events.begin(), events.end(), [](const ProfilerEvent& a, const ProfilerEvent& b) {
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.depth != b.depth ? a.depth < b.depth : a.id < b.id;
  });
  return events;
}

int64_t open_range(std::string_view name, std::shared_ptr<void>& buffer) {
  ThreadBuffer* b = current_buffer();
  if (!b) return -1;
  Frame f = new_frame(*b, std::string(name), EventKind::UserRange);
  const int64_t id = f.event.id;
  open(*b, std::move(f));
  buffer = t_buffer;
  return id;
}

void close_range(const std::shared_ptr<void>& buffer, int64_t id) {
  auto* b = static_cast<ThreadBuffer*>(buffer.get());
  // a range closed on another thread, or no longer open (its collection ended), is dropped
  if (!b || b->thread_id != this_thread_id()) return;
  // ranges may close out of order (one opened inside a schedule's step range outlives the step):
  // the range is closed where it is in the stack, and those opened inside it stay open
  for (size_t at = b->stack.size(); at-- > 0;) {
    const ProfilerEvent& e = b->stack[at].event;
    if (e.id == id) return close(*b, std::nullopt, at);
    if (e.kind == EventKind::Op) return;  // an op still running: a range inside it closes first
  }
}

}  // namespace strata::profiler::detail
