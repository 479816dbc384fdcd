// CUDA devices, streams, events and the caching device allocator. In a build without CUDA
// every function here exists: the queries answer "nothing" (device_count() is 0) and the
// rest raise strata::Error naming the STRATA_WITH_CUDA option.
//
// Device indices are CUDA ordinals; -1 means the calling thread's current device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <strata/core/device.hpp>
#include <strata/core/export.hpp>

namespace strata {
class Tensor;
}

namespace strata::cuda {

struct DeviceProperties {
  std::string name;
  int64_t total_memory = 0;  ///< bytes of global memory
  int multiprocessor_count = 0;
  int major = 0;  ///< compute capability, major.minor (9.0 for H100)
  int minor = 0;
  int64_t shared_memory_per_block_optin = 0;  ///< bytes of shared memory a block may opt in to
};

STRATA_API DeviceProperties get_device_properties(int device = -1);
/// The calling thread's current device (cudaGetDevice).
STRATA_API int current_device();
STRATA_API void set_device(int device);
/// Waits until all work queued on `device` has finished.
STRATA_API void synchronize(int device = -1);

/// Makes `device` current for its lifetime, restoring the previous one afterwards.
class STRATA_API DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class Event;

/// A CUDA stream: a handle, not an owner. Each device has a default stream (the legacy null
/// stream) and a fixed pool of user streams that live as long as the process, handed out
/// round-robin by create(), as PyTorch does, so a Stream value never dangles and the
/// allocator's per-stream pools never see a recycled handle.
class STRATA_API Stream {
 public:
  /// The default stream of `device`.
  static Stream default_stream(int device = -1);
  /// The calling thread's current stream of `device` (see StreamGuard).
  static Stream current(int device = -1);
  /// A user stream that does not synchronize with the default stream. priority < 0 asks for
  /// a high-priority stream (scheduled ahead of normal ones), 0 for a normal one.
  static Stream create(int device = -1, int priority = 0);

  int device() const { return device_; }
  /// The cudaStream_t, as void* so this header needs no CUDA headers.
  void* handle() const { return handle_; }
  bool is_default() const { return handle_ == nullptr; }
  int priority() const;
  /// True when all work queued so far has finished.
  bool query() const;
  void synchronize() const;
  /// Makes work queued later on this stream wait until `event` has completed.
  void wait(const Event& event) const;

  bool operator==(const Stream& o) const { return device_ == o.device_ && handle_ == o.handle_; }

 private:
  Stream(int device, void* handle) : device_(device), handle_(handle) {}
  int device_ = 0;
  void* handle_ = nullptr;
};

/// Makes `stream` the current stream of its device for the calling thread (and its device
/// the current device) until the guard dies. Every op's kernels and copies go on the current
/// stream.
class STRATA_API StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  int previous_device_;
};

/// A CUDA event. Created on first record(); copies share the same event.
class STRATA_API Event {
 public:
  explicit Event(bool enable_timing = false);
  /// Records the event on `stream` (its device's current stream by default).
  void record(const Stream& stream);
  void record();
  /// True when the work recorded before the event has finished (or it was never recorded).
  bool query() const;
  void synchronize() const;
  /// Milliseconds from this event to `end`; both recorded with enable_timing and completed.
  float elapsed_time(const Event& end) const;
  bool is_recorded() const;
  /// The cudaEvent_t (nullptr before the first record).
  void* handle() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// Whether float32 matmuls on CUDA (matmul, mm, bmm, linear) may run on TF32 tensor cores:
/// inputs rounded to a 10-bit mantissa, products accumulated in float32; several times faster,
/// with relative errors near 1e-3 instead of float32's 1e-6. Off by default, as in PyTorch
/// since 1.12 (torch.backends.cuda.matmul.allow_tf32). Process-wide; read when each matmul is
/// launched. float16, bfloat16 and float64 matmuls do not depend on it. In a build without
/// CUDA it can be set and read, and changes nothing.
STRATA_API void set_allow_tf32(bool allow);
STRATA_API bool allow_tf32();

/// Caching-allocator statistics of one device (bytes and counts since process start, peaks
/// since the last reset_peak_memory_stats).
struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;     ///< sizes (rounded) of live blocks
  int64_t requested_bytes = 0;     ///< bytes the callers asked for, of live blocks
  int64_t reserved_bytes = 0;      ///< bytes held from cudaMalloc: live plus cached
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t inactive_split_bytes = 0;  ///< free bytes inside segments that also hold live blocks
  double fragmentation = 0;          ///< inactive_split_bytes / reserved_bytes
  int64_t num_segments = 0;          ///< cudaMalloc'd segments held now
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_cache_hits = 0;        ///< allocations served without cudaMalloc
  int64_t num_raw_allocs = 0;        ///< cudaMalloc calls that succeeded
  int64_t num_raw_frees = 0;         ///< cudaFree calls
  int64_t num_ooms = 0;              ///< allocations that failed even after freeing the cache
  int64_t num_pending_frees = 0;     ///< freed blocks waiting on other streams' events
  int64_t graph_pool_bytes = 0;      ///< reserved bytes held by CUDA graphs' private pools
};

STRATA_API DeviceMemoryStats memory_stats(int device = -1);
STRATA_API void reset_peak_memory_stats(int device = -1);
/// Returns every cached block that is a whole segment to CUDA (cudaFree), on every device,
/// and the cached pinned host buffers (cudaFreeHost).
STRATA_API void empty_cache();
/// Marks the CUDA tensor's memory as used by work on `stream`: when the tensor is freed the
/// memory is not reused until the work queued on `stream` up to that point has finished
/// (PyTorch's Tensor.record_stream). Needed when a tensor made on one stream is used on
/// another.
STRATA_API void record_stream(const Tensor& tensor, const Stream& stream);

// ---- convolution algorithms (cuDNN) --------------------------------------------------------

/// Benchmark mode (torch.backends.cudnn.benchmark): the first convolution of each problem
/// (shapes, layout, dtype, stride, padding, dilation, groups) times cuDNN's algorithms on the
/// call's own data (cudnnFind*AlgorithmEx) and the fastest is cached for the process; later
/// calls reuse it. Off (the default): cuDNN's heuristics choose, and that choice is cached
/// too. Worth turning on when input shapes repeat, as in most training loops. float32
/// convolutions use TF32 tensor cores only when allow_tf32() is on.
STRATA_API void set_benchmark_mode(bool on);
STRATA_API bool benchmark_mode();

/// Asks CUDA ops for results that are bitwise identical from run to run, where they have a
/// choice (torch.backends.cudnn.deterministic): convolutions use only deterministic cuDNN
/// algorithms (some fast backward ones, which add with atomics, are skipped), and
/// scatter_add / index_add sum in a fixed order. Off by default. Pooling and batch norm are
/// deterministic always.
STRATA_API void set_deterministic(bool on);
STRATA_API bool deterministic();

/// The convolution algorithm cache: problems cached, algorithm searches run (timed ones in
/// benchmark mode, heuristic queries otherwise) and calls served from the cache.
struct ConvAlgorithmCacheStats {
  int64_t entries = 0;
  int64_t searches = 0;
  int64_t hits = 0;
};
STRATA_API ConvAlgorithmCacheStats conv_algorithm_cache_stats();

}  // namespace strata::cuda
