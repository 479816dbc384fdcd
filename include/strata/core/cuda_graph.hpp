// CUDA graphs: capture the kernels a piece of work queues on a stream once, then replay them
// with one launch (torch.cuda.CUDAGraph, torch.cuda.graph). In a build without CUDA every
// function here exists and raises strata::Error naming the STRATA_WITH_CUDA option
// (is_current_stream_capturing() answers false). See docs/cuda-graphs.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <strata/core/cuda.hpp>
#include <strata/core/export.hpp>

namespace strata::cuda {

/// What CUDA refuses while a capture is underway (cudaStreamCaptureMode). Global: no thread
/// may make a call that could wait for the device; ThreadLocal: only the capturing thread is
/// held to that; Relaxed: no thread is (the calls still fail if they touch the capture).
enum class CaptureMode { Global, ThreadLocal, Relaxed };

/// A handle to a graph memory pool (torch.cuda.graph_pool_handle): graphs captured with the
/// same handle allocate from one private pool and may share memory, which is safe when they
/// are replayed in the order they were captured. A default handle (id 0) asks for a new pool.
struct GraphPool {
  uint64_t id = 0;
};
/// A new pool handle, to pass to several captures.
STRATA_API GraphPool graph_pool_handle();

/// Whether the calling thread's current stream is capturing a graph now
/// (torch.cuda.is_current_stream_capturing). False in a build without CUDA.
STRATA_API bool is_current_stream_capturing();

/// A captured CUDA graph. During capture, strata ops queue nothing that runs: their kernels
/// are recorded, and their outputs are allocated from the graph's private pool, which stays
/// reserved while the graph lives, because every replay writes there. Tensors made during
/// capture (the static outputs) keep the addresses replays write to.
class STRATA_API Graph {
 public:
  Graph();
  /// Same as reset(); never raises (a failure is reported on stderr).
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Starts capturing the current stream of the current device, which must not be the
  /// default stream (a side stream: see GraphCapture). Raises when this graph already holds a
  /// capture, when this thread is already capturing (nested capture), or when the stream is.
  void capture_begin(GraphPool pool = {}, CaptureMode mode = CaptureMode::Global);
  /// Ends the capture (on the stream it began on) and instantiates the graph. When an
  /// operation during the capture was refused by CUDA, raises with CUDA's reason and leaves
  /// the graph empty.
  void capture_end();
  /// Launches the captured work on the current stream of the graph's device.
  void replay();
  /// Drops the captured graph (waiting for its replays) and lets its pool go; the graph may
  /// capture again afterwards.
  void reset();
  /// Whether a capture has ended successfully and not been reset.
  bool captured() const;
  /// The pool this graph allocated from (to share it with a later capture).
  GraphPool pool() const;
  /// The number of nodes (kernels, copies, memsets) the capture recorded.
  int64_t num_nodes() const;

 private:
  void abandon_capture() noexcept;  // ends a failed capture, keeping nothing
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend class GraphCapture;
};

/// Captures everything queued in its scope into `graph` (torch.cuda.graph): waits for the
/// device, makes `stream` current (by default one capture stream per device, shared by all
/// captures so that graphs sharing a pool reuse each other's memory) and begins capturing; the
/// end of the scope ends the capture. When the scope is left by an exception, the capture is
/// abandoned and the graph stays empty. The destructor raises (it is noexcept(false)) when the
/// capture itself fails, unless an exception is already propagating.
class STRATA_API GraphCapture {
 public:
  explicit GraphCapture(Graph& graph, GraphPool pool = {}, std::optional<Stream> stream = std::nullopt,
                        CaptureMode mode = CaptureMode::Global);
  ~GraphCapture() noexcept(false);
  GraphCapture(const GraphCapture&) = delete;
  GraphCapture& operator=(const GraphCapture&) = delete;

 private:
  Graph& graph_;
  int uncaught_;
  std::optional<StreamGuard> guard_;
};

/// Graphs a whole step (docs/cuda-graphs.md, "Graphing a training step"): runs `step`
/// `warmup` times eagerly on the capture stream (so lazily made state, such as optimizer
/// moments, cuBLAS workspaces and cuDNN algorithm choices, exists before capture), waits for
/// the device, then captures one more call of `step` into `graph`. `step` must read its
/// inputs from static tensors, which the caller refills (copy_) before each replay().
STRATA_API void capture_step(Graph& graph, const std::function<void()>& step, int warmup = 3, GraphPool pool = {});

}  // namespace strata::cuda
