// The device backend of a build without CUDA: only the CPU exists. Queries answer "none"
// (device_count() is 0, empty_cache() has nothing to do); everything that would need a GPU
// raises an Error that says which build option turns it on.
#include <atomic>
#include <cstring>

#include <strata/core/cuda.hpp>
#include <strata/core/cuda_graph.hpp>
#include <strata/core/error.hpp>

#include "core/backend.h"

namespace strata {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  detail::throw_error("[{}] strata was built without CUDA (reconfigure with -DSTRATA_WITH_CUDA=ON)", op);
}
}  // namespace

namespace cuda {
bool is_available() { return false; }
int device_count() { return 0; }

DeviceProperties get_device_properties(int) { no_cuda("get_device_properties"); }
int current_device() { no_cuda("current_device"); }
void set_device(int) { no_cuda("set_device"); }
void synchronize(int) { no_cuda("synchronize"); }
DeviceGuard::DeviceGuard(int) { no_cuda("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;

Stream Stream::default_stream(int) { no_cuda("default_stream"); }
Stream Stream::current(int) { no_cuda("current_stream"); }
Stream Stream::create(int, int) { no_cuda("Stream::create"); }
int Stream::priority() const { no_cuda("Stream::priority"); }
bool Stream::query() const { no_cuda("Stream::query"); }
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
void Stream::wait(const Event&) const { no_cuda("Stream::wait"); }
StreamGuard::StreamGuard(const Stream& s) : previous_(s), previous_device_(0) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;

// An Event can be made (it is created lazily on record in the CUDA build too); using it raises.
struct Event::Impl {};
Event::Event(bool) : impl_(std::make_shared<Impl>()) {}
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::record() { no_cuda("Event::record"); }
bool Event::query() const { no_cuda("Event::query"); }
void Event::synchronize() const { no_cuda("Event::synchronize"); }
float Event::elapsed_time(const Event&) const { no_cuda("Event::elapsed_time"); }
bool Event::is_recorded() const { return false; }
void* Event::handle() const { return nullptr; }

// The TF32 switch is a plain setting: harmless to set where no GPU matmul reads it.
namespace {
std::atomic<bool> g_allow_tf32{false};
}
void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

DeviceMemoryStats memory_stats(int) { no_cuda("memory_stats"); }
void reset_peak_memory_stats(int) { no_cuda("reset_peak_memory_stats"); }
void empty_cache() {}
void record_stream(const Tensor&, const Stream&) { no_cuda("record_stream"); }

// The convolution switches are plain settings here: they can be set and read, and no
// convolution reads them; no algorithm is ever cached.
namespace {
std::atomic<bool> g_conv_benchmark{false}, g_conv_deterministic{false};
}
void set_benchmark_mode(bool on) { g_conv_benchmark.store(on, std::memory_order_relaxed); }
bool benchmark_mode() { return g_conv_benchmark.load(std::memory_order_relaxed); }
void set_deterministic(bool on) { g_conv_deterministic.store(on, std::memory_order_relaxed); }
bool deterministic() { return g_conv_deterministic.load(std::memory_order_relaxed); }
ConvAlgorithmCacheStats conv_algorithm_cache_stats() { return {}; }

// CUDA graphs: nothing is ever capturing; everything else raises.
GraphPool graph_pool_handle() { no_cuda("graph_pool_handle"); }
bool is_current_stream_capturing() { return false; }
struct Graph::Impl {};
Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
void Graph::capture_begin(GraphPool, CaptureMode) { no_cuda("Graph::capture_begin"); }
void Graph::capture_end() { no_cuda("Graph::capture_end"); }
void Graph::replay() { no_cuda("Graph::replay"); }
void Graph::reset() {}
void Graph::abandon_capture() noexcept {}
bool Graph::captured() const { return false; }
GraphPool Graph::pool() const { return {}; }
int64_t Graph::num_nodes() const { return 0; }
GraphCapture::GraphCapture(Graph& graph, GraphPool, std::optional<Stream>, CaptureMode)
    : graph_(graph), uncaught_(0) {
  no_cuda("GraphCapture");
}
GraphCapture::~GraphCapture() noexcept(false) = default;
void capture_step(Graph&, const std::function<void()>&, int, GraphPool) { no_cuda("capture_step"); }
}  // namespace cuda

Allocator& pinned_allocator() { return cpu_allocator(); }
bool pinned_memory_is_page_locked() { return false; }

namespace backend {

void check_device(Device device, const char* op) {
  STRATA_CHECK(device.is_cpu(), "[{}] device {} is not available: strata was built without CUDA "
               "(reconfigure with -DSTRATA_WITH_CUDA=ON)", op, device);
}

Allocator& allocator_for(Device device) {
  check_device(device, "allocate");
  return cpu_allocator();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool) {
  check_device(dst_device, "copy");
  check_device(src_device, "copy");
  if (nbytes) std::memcpy(dst, src, nbytes);
}

}  // namespace backend
}  // namespace strata
