// CUDA graphs (<strata/core/cuda_graph.hpp>): stream capture into a graph, its instantiation
// and replay, the capture guard, and the capture checks of src/core/cuda/capture.h.
//
// Memory: a capture begins routing the allocations of its capture id (the stream's, and of
// any stream forked from it) to the graph's private pool in the caching allocator; the graph
// holds that pool until reset (Note [Graph pools] in src/core/block_pool.h).
//
// Note [Graph replay slots]
// Some captured kernels need values that change from run to run: random draws (a Philox seed
// and offset) and optimizer steps (bias corrections from the step count). Passed by value,
// every replay would repeat the capture's. So during capture the launcher asks for a replay
// slot: bytes in the graph's pool that the kernel reads the values from, and a host function
// that computes them. replay() calls the functions in capture order, each writing its slot on
// the replay stream before the graph is launched; a function may also advance host state
// (the generator's offset, the optimizer's step count) as the eager call would have.
//
// Note [Graph random draws]
// A random draw's slot holds {seed, offset}; its function reserves the same number of Philox
// blocks from the same generator as the captured op did. A replay thus draws exactly what the
// captured ops would draw eagerly from the generators' state at replay time, and advances the
// generators as they would. The generators must outlive the graph (the default one does).
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>

#include <strata/core/cuda_graph.hpp>
#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"
#include "core/cuda/stream.h"
#include "core/tensor_internal.h"

namespace strata::cuda {

namespace {

std::array<std::atomic<int>, kMaxDevices> g_captures{};  // strata captures underway per device

// A replay slot of a graph (Note [Graph replay slots]).
struct ReplaySlot {
  std::function<void(void*)> refill;  // writes the slot's bytes for the next replay
  Tensor slot;                        // undefined for a slot of zero bytes
};
// The slots of the graph this thread is capturing; nullptr when it captures none.
thread_local std::vector<ReplaySlot>* t_slots = nullptr;
std::atomic<uint64_t> g_next_pool{1};

cudaStreamCaptureMode to_cuda(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::ThreadLocal: return cudaStreamCaptureModeThreadLocal;
    case CaptureMode::Relaxed: return cudaStreamCaptureModeRelaxed;
    default: return cudaStreamCaptureModeGlobal;
  }
}

// One capture stream per device, shared by every GraphCapture that names none, so that graphs
// sharing a pool (whose free blocks are kept per stream) reuse each other's memory.
Stream capture_stream(int device) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<std::optional<Stream>, kMaxDevices> streams;
  device = resolve_device(device, "GraphCapture");
  std::call_once(once[device], [&] { streams[device].emplace(Stream::create(device)); });
  return *streams[device];
}

}  // namespace

// ---- capture checks (capture.h) ----------------------------------------------------------

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err == cudaErrorStreamCaptureImplicit) {  // the legacy stream while a blocking stream captures
    cudaGetLastError();
    return true;
  }
  STRATA_CUDA_CHECK(err, "capture check");
  return status != cudaStreamCaptureStatusNone;
}

bool this_thread_capturing() { return t_slots != nullptr; }

void* graph_replay_slot(size_t bytes, int device, std::function<void(void*)> refill, const char* op) {
  STRATA_CHECK(t_slots, "[{}] a stream is capturing a CUDA graph that this thread did not begin with "
               "strata::cuda::Graph: the values this op needs could not be renewed for each replay", op);
  Tensor slot;
  if (bytes) slot = detail::make_tensor({static_cast<int64_t>(bytes)}, kUInt8, Device::cuda(device));  // graph pool
  t_slots->push_back({std::move(refill), slot});
  return slot.defined() ? slot.data() : nullptr;
}

const uint64_t* graph_philox_state(Generator* gen, uint64_t blocks, int device, const char* op) {
  STRATA_CHECK(gen, "[{}] a random draw without its generator cannot be captured in a CUDA graph", op);
  auto redraw = [gen, blocks](void* out) {
    const RandomDraw draw = gen->reserve_draw(blocks);
    const uint64_t next[2] = {draw.seed, draw.offset};
    std::memcpy(out, next, sizeof(next));
  };
  return static_cast<const uint64_t*>(graph_replay_slot(2 * sizeof(uint64_t), device, redraw, op));
}

bool capture_underway(int device) {
  return device >= 0 && device < kMaxDevices && g_captures[device].load(std::memory_order_acquire) > 0;
}

void check_not_capturing(cudaStream_t stream, const char* op, const char* what, const char* why) {
  STRATA_CHECK(!stream_capturing(stream), "[{}] {} cannot be captured in a CUDA graph: {}", op, what, why);
}

RelaxedCaptureMode::RelaxedCaptureMode() {
  STRATA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_), "capture mode");
}
RelaxedCaptureMode::~RelaxedCaptureMode() {
  STRATA_CUDA_WARN(cudaThreadExchangeStreamCaptureMode(&previous_), "capture mode");
}

bool is_current_stream_capturing() {
  if (!is_available()) return false;
  return stream_capturing(current_stream(current_device()));
}

GraphPool graph_pool_handle() { return GraphPool{g_next_pool.fetch_add(1)}; }

// ---- Graph -------------------------------------------------------------------------------

struct Graph::Impl {
  int device = -1;
  cudaStream_t stream = nullptr;  // the stream the capture began on
  unsigned long long capture_id = 0;
  bool capturing = false;
  uint64_t pool = 0;  // the pool held from capture_begin until reset; 0: none
  cudaGraphExec_t exec = nullptr;
  int64_t nodes = 0;
  cudaEvent_t replayed = nullptr;  // recorded after each replay: reset waits for it
  std::vector<ReplaySlot> slots;   // in capture order

  void stop_capturing() noexcept {  // the allocator and the counters forget the capture
    try {
      end_graph_allocations(device, capture_id);
    } catch (const std::exception& e) {
      fmt::print(stderr, "[Graph] ending the capture's allocations failed: {}\n", e.what());
    }
    capturing = false;
    t_slots = nullptr;
    g_captures[device].fetch_sub(1, std::memory_order_acq_rel);
  }
  void release_pool() {
    slots.clear();  // their memory is in the pool
    if (!pool) return;
    const uint64_t p = std::exchange(pool, 0);
    release_graph_pool(device, p);
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}

Graph::~Graph() {
  try {
    reset();
  } catch (const std::exception& e) {
    fmt::print(stderr, "[Graph] reset on destruction failed: {}\n", e.what());
  }
}

void Graph::capture_begin(GraphPool pool, CaptureMode mode) {
  Impl& g = *impl_;
  STRATA_CHECK(!t_slots, "[Graph::capture_begin] nested capture: this thread is already capturing a CUDA graph; "
               "end that capture first");
  STRATA_CHECK(!g.capturing && !g.exec && !g.pool,
               "[Graph::capture_begin] this graph already holds a capture: reset() it before capturing again");
  const int device = resolve_device(-1, "Graph::capture_begin");
  cudaStream_t stream = current_stream(device);
  STRATA_CHECK(stream != nullptr, "[Graph::capture_begin] cannot capture the default stream of cuda:{}: capture on a "
               "side stream (GraphCapture, or a StreamGuard on Stream::create())", device);
  STRATA_CHECK(!stream_capturing(stream), "[Graph::capture_begin] nested capture: the current stream of cuda:{} is "
               "already capturing a graph", device);
  const uint64_t pool_id = pool.id ? pool.id : graph_pool_handle().id;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream, to_cuda(mode)), "Graph::capture_begin");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, &id);
  if (err != cudaSuccess) {
    cudaGraph_t discarded = nullptr;
    cudaStreamEndCapture(stream, &discarded);
    if (discarded) cudaGraphDestroy(discarded);
    detail::throw_error("[Graph::capture_begin] cudaStreamGetCaptureInfo failed: {}", cudaGetErrorString(err));
  }
  begin_graph_allocations(device, id, pool_id);
  g.device = device;
  g.stream = stream;
  g.capture_id = id;
  g.pool = pool_id;
  g.capturing = true;
  g.slots.clear();
  t_slots = &g.slots;
  g_captures[device].fetch_add(1, std::memory_order_acq_rel);
}

void Graph::capture_end() {
  Impl& g = *impl_;
  STRATA_CHECK(g.capturing, "[Graph::capture_end] no capture is underway on this graph");
  STRATA_CHECK(current_stream(g.device) == g.stream, "[Graph::capture_end] the current stream is not the one the "
               "capture began on: end the capture in the scope (StreamGuard, GraphCapture) that began it");
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(g.stream, &graph);
  g.stop_capturing();
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    g.release_pool();
    detail::throw_error("[Graph::capture_end] the capture failed (cudaStreamEndCapture: {}): an operation during the "
                        "capture is not allowed in a CUDA graph (one that waits for the device, such as a "
                        "synchronize, a host copy or .item(), a raw cudaMalloc, or work forked to another stream "
                        "and not joined back), or another thread made such a call during a Global-mode capture",
                        cudaGetErrorString(err));
  }
  size_t nodes = 0;
  cudaError_t st = cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  if (st == cudaSuccess) st = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (st != cudaSuccess) {
    cudaGetLastError();
    g.release_pool();
    detail::throw_error("[Graph::capture_end] instantiating the captured graph failed: {}", cudaGetErrorString(st));
  }
  g.exec = exec;
  g.nodes = static_cast<int64_t>(nodes);
}

void Graph::replay() {
  Impl& g = *impl_;
  STRATA_CHECK(g.exec, "[Graph::replay] nothing captured: capture first (capture_begin/capture_end or GraphCapture)");
  DeviceGuard guard(g.device);
  cudaStream_t stream = current_stream(g.device);
  std::vector<char> next;
  for (ReplaySlot& d : g.slots) {
    next.assign(d.slot.defined() ? d.slot.nbytes() : 0, 0);
    d.refill(next.data());
    // pageable source: CUDA stages it before returning, so `next` may be rewritten at once
    if (!next.empty())
      STRATA_CUDA_CHECK(cudaMemcpyAsync(d.slot.data(), next.data(), next.size(), cudaMemcpyHostToDevice, stream),
                        "Graph::replay");
  }
  STRATA_CUDA_CHECK(cudaGraphLaunch(g.exec, stream), "Graph::replay");
  if (!g.replayed) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&g.replayed, cudaEventDisableTiming), "Graph::replay");
  STRATA_CUDA_CHECK(cudaEventRecord(g.replayed, stream), "Graph::replay");
}

void Graph::abandon_capture() noexcept {
  Impl& g = *impl_;
  if (!g.capturing) return;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(g.stream, &graph);  // an invalidated capture ends with an error: expected here
  cudaGetLastError();
  if (graph) cudaGraphDestroy(graph);
  g.stop_capturing();
}

void Graph::reset() {
  Impl& g = *impl_;
  abandon_capture();
  if (g.exec) {
    // replays write the pool's memory: it goes back only after the last one finished
    STRATA_CHECK(!g.replayed || !capture_underway(g.device), "[Graph::reset] cannot wait for this graph's replays "
                 "while another capture is underway on cuda:{}: reset it after that capture ends", g.device);
    if (g.replayed) STRATA_CUDA_CHECK(cudaEventSynchronize(g.replayed), "Graph::reset");
    STRATA_CUDA_WARN(cudaGraphExecDestroy(g.exec), "Graph::reset");
    g.exec = nullptr;
    g.nodes = 0;
  }
  if (g.replayed) {
    STRATA_CUDA_WARN(cudaEventDestroy(g.replayed), "Graph::reset");
    g.replayed = nullptr;
  }
  g.release_pool();
}

bool Graph::captured() const { return impl_->exec != nullptr; }
GraphPool Graph::pool() const { return GraphPool{impl_->pool}; }
int64_t Graph::num_nodes() const { return impl_->nodes; }

// ---- GraphCapture and capture_step --------------------------------------------------------

GraphCapture::GraphCapture(Graph& graph, GraphPool pool, std::optional<Stream> stream, CaptureMode mode)
    : graph_(graph), uncaught_(std::uncaught_exceptions()) {
  STRATA_CHECK(!t_slots, "[GraphCapture] nested capture: this thread is already capturing a CUDA graph");
  const Stream side = stream ? *stream : capture_stream(-1);
  STRATA_CHECK(!side.is_default(), "[GraphCapture] cannot capture the default stream of cuda:{}", side.device());
  synchronize(side.device());  // nothing queued before the capture may run inside it (as torch.cuda.graph)
  guard_.emplace(side);
  graph_.capture_begin(pool, mode);
}

GraphCapture::~GraphCapture() noexcept(false) {
  if (!graph_.impl_->capturing) return;
  if (std::uncaught_exceptions() > uncaught_) {
    graph_.abandon_capture();  // the scope failed: the capture is dropped with it
    try {
      graph_.reset();
    } catch (const std::exception& e) {
      fmt::print(stderr, "[GraphCapture] dropping the failed capture: {}\n", e.what());
    }
    return;
  }
  graph_.capture_end();
}

void capture_step(Graph& graph, const std::function<void()>& step, int warmup, GraphPool pool) {
  STRATA_CHECK(static_cast<bool>(step), "[capture_step] the step function is empty");
  STRATA_CHECK(warmup >= 0, "[capture_step] warmup must be >= 0, got {}", warmup);
  const int device = resolve_device(-1, "capture_step");
  const Stream side = capture_stream(device);
  synchronize(device);  // the side stream sees everything queued so far
  {
    StreamGuard guard(side);
    for (int i = 0; i < warmup; ++i) step();
  }
  GraphCapture capture(graph, pool, side);
  step();
}

}  // namespace strata::cuda
