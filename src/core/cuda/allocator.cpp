// The caching CUDA device allocator: a BlockPool (src/core/block_pool.h) per device over
// plain cudaMalloc/cudaFree (never managed memory), with cudaEvents for record_stream.
// Blocks are allocated for the current stream of the device (src/core/cuda/stream.h); while
// that stream captures a graph, from the graph's private pool (Note [Graph pools]).
#include <cstdio>
#include <mutex>
#include <vector>

#include <strata/core/allocator.hpp>
#include <strata/core/cuda.hpp>
#include <strata/core/tensor.hpp>

#include "core/block_pool.h"
#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"
#include "core/cuda/stream.h"

namespace strata::cuda {

namespace {

class CudaPoolBackend final : public detail::PoolBackend {
 public:
  explicit CudaPoolBackend(int device) : device_(device) {}

  void* raw_alloc(size_t nbytes) override {
    DeviceGuard guard(device_);
    // a new segment during someone's capture: cudaMalloc touches no stream, so it is allowed
    RelaxedCaptureMode relaxed;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // out of memory is not sticky; clear it so later calls succeed
      last_error_ = cudaGetErrorString(err);
      return nullptr;
    }
    STRATA_CUDA_CHECK(err, "cuda allocator");
    return p;
  }
  void raw_free(void* ptr, size_t) override {
    DeviceGuard guard(device_);
    STRATA_CUDA_CHECK(cudaFree(ptr), "cuda allocator");
  }
  void* record_event(detail::StreamId stream) override { return record_free_event(device_, stream, "record_stream"); }
  bool event_done(void* event) override { return free_event_done(event, "cuda allocator"); }
  void synchronize_event(void* event) override { synchronize_free_event(event, "cuda allocator"); }
  void release_event(void* event) override { release_free_event(event, "cuda allocator"); }
  std::string oom_detail() override {
    size_t free_b = 0, total_b = 0;
    std::string out = "cudaMalloc: " + last_error_;
    DeviceGuard guard(device_);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      out += fmt::format(", {} of {} bytes free on the device", free_b, total_b);
    else
      cudaGetLastError();
    return out;
  }

 private:
  int device_;
  std::string last_error_;
};

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device)
      : device_(device), backend_(device), pool_(backend_, fmt::format("cuda:{}", device)) {}

  void* allocate(size_t nbytes) override {
    cudaStream_t stream = current_stream(device_);
    detail::CaptureId capture = 0;
    if (capture_underway(device_)) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      unsigned long long id = 0;
      STRATA_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id), "cuda allocator");
      if (status == cudaStreamCaptureStatusActive) capture = id;
    }
    return pool_.allocate(nbytes, reinterpret_cast<detail::StreamId>(stream), capture);
  }
  void deallocate(void* ptr, size_t) override { pool_.free(ptr); }
  MemoryStats stats() const override { return detail::allocator_stats(pool_.stats()); }
  void empty_cache() override { pool_.empty_cache(); }
  void reset_peak() override { pool_.reset_peak(); }
  Device device() const override { return Device::cuda(device_); }
  detail::BlockPool& pool() { return pool_; }

 private:
  int device_;
  CudaPoolBackend backend_;
  detail::BlockPool pool_;
};

// Never destroyed: tensors may outlive static destructors, and cudaFree after the runtime
// has shut down fails.
std::vector<CudaCachingAllocator*>& allocators() {
  static std::once_flag once;
  static std::vector<CudaCachingAllocator*> all;
  std::call_once(once, [] {
    for (int i = 0; i < device_count() && i < kMaxDevices; ++i) all.push_back(new CudaCachingAllocator(i));
  });
  return all;
}

}  // namespace

Allocator& device_allocator(int device) { return *allocators().at(static_cast<size_t>(device)); }

DeviceMemoryStats memory_stats(int device) {
  device = resolve_device(device, "memory_stats");
  detail::PoolStats p = allocators()[device]->pool().stats();
  DeviceMemoryStats s;
  s.allocated_bytes = p.allocated_bytes;
  s.requested_bytes = p.requested_bytes;
  s.reserved_bytes = p.reserved_bytes;
  s.peak_allocated_bytes = p.peak_allocated_bytes;
  s.peak_reserved_bytes = p.peak_reserved_bytes;
  s.inactive_split_bytes = p.inactive_split_bytes;
  s.fragmentation = p.fragmentation;
  s.num_segments = p.num_segments;
  s.num_allocs = p.num_allocs;
  s.num_frees = p.num_frees;
  s.num_cache_hits = p.num_cache_hits;
  s.num_raw_allocs = p.num_raw_allocs;
  s.num_raw_frees = p.num_raw_frees;
  s.num_ooms = p.num_ooms;
  s.num_pending_frees = p.num_pending_frees;
  s.graph_pool_bytes = p.private_pool_bytes;
  return s;
}

void begin_graph_allocations(int device, uint64_t capture, uint64_t pool) {
  allocators().at(static_cast<size_t>(device))->pool().begin_capture(capture, pool);
}
void end_graph_allocations(int device, uint64_t capture) {
  allocators().at(static_cast<size_t>(device))->pool().end_capture(capture);
}
void release_graph_pool(int device, uint64_t pool) {
  allocators().at(static_cast<size_t>(device))->pool().release_pool(pool);
}

void reset_peak_memory_stats(int device) {
  allocators()[resolve_device(device, "reset_peak_memory_stats")]->reset_peak();
}

void empty_cache() {
  if (!is_available()) return;  // nothing is cached on a machine without a GPU
  for (CudaCachingAllocator* a : allocators()) a->empty_cache();
  empty_pinned_cache();
}

void record_stream(const Tensor& tensor, const Stream& stream) {
  STRATA_CHECK(tensor.defined() && tensor.device().is_cuda(), "[record_stream] expects a CUDA tensor, got {}",
               tensor.defined() ? fmt::format("one on {}", tensor.device()) : std::string("an undefined tensor"));
  STRATA_CHECK(tensor.device().index == stream.device(),
               "[record_stream] the tensor is on {} but the stream on cuda:{}", tensor.device(), stream.device());
  void* base = tensor.storage()->data();
  if (!base) return;  // zero bytes
  // Memory the allocator did not hand out (from_blob) is the user's to order: ignored, as in PyTorch.
  allocators()[stream.device()]->pool().record_stream(base, reinterpret_cast<detail::StreamId>(stream.handle()));
}

}  // namespace strata::cuda
