// The CUDA device backend of core (src/core/backend.h): the device allocators, the cached
// page-locked host allocator and byte copies ordered on the current stream.
#include <cstring>
#include <mutex>

#include <strata/core/cuda.hpp>

#include "core/backend.h"
#include "core/host_cache.h"
#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"
#include "core/cuda/stream.h"

namespace strata {

namespace {

class CudaHostBackend final : public detail::HostBackend {
 public:
  void* raw_alloc(size_t nbytes) override {
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    STRATA_CUDA_CHECK(err, "pinned allocator");
    return p;
  }
  void raw_free(void* ptr) override { STRATA_CUDA_CHECK(cudaFreeHost(ptr), "pinned allocator"); }
  void* record_event(int device, detail::StreamId stream) override { return cuda::record_free_event(device, stream, "pinned allocator"); }
  bool event_done(void* event) override { return cuda::free_event_done(event, "pinned allocator"); }
  void synchronize_event(void* event) override { cuda::synchronize_free_event(event, "pinned allocator"); }
  void release_event(void* event) override { cuda::release_free_event(event, "pinned allocator"); }
};

// Page-locked host memory, cached (src/core/host_cache.h).
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override { return cache_.allocate(nbytes); }
  void deallocate(void* ptr, size_t) override { cache_.free(ptr); }
  MemoryStats stats() const override { return detail::allocator_stats(cache_.stats()); }
  void empty_cache() override { cache_.empty_cache(); }
  void reset_peak() override { cache_.reset_peak(); }
  Device device() const override { return kCPU; }
  detail::HostCache& cache() { return cache_; }

 private:
  CudaHostBackend backend_;
  detail::HostCache cache_{backend_};
};

// Never destroyed, like the device allocators: pinned tensors may outlive static destructors.
PinnedAllocator* pinned() {
  static auto* a = new PinnedAllocator();
  return a;
}

}  // namespace

Allocator& pinned_allocator() {
  if (!cuda::is_available()) return cpu_allocator();
  return *pinned();
}

namespace cuda {
void empty_pinned_cache() {
  if (is_available()) pinned()->empty_cache();
}
}  // namespace cuda
bool pinned_memory_is_page_locked() { return cuda::is_available(); }

namespace backend {

void check_device(Device device, const char* op) {
  if (device.is_cpu()) return;
  int n = cuda::device_count();
  STRATA_CHECK(device.index >= 0 && device.index < n, "[{}] device {} is not available: {} CUDA device(s) visible", op,
               device, n);
  STRATA_CHECK(device.index < cuda::kMaxDevices, "[{}] device {}: a process addresses at most {} CUDA devices", op,
               device, cuda::kMaxDevices);
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  check_device(device, "allocate");
  return cuda::device_allocator(device.index);
}

// Copies go on the current stream of the GPU side (of the source for GPU to GPU), as
// kernels do, so they are ordered with the ops around them. A blocking copy waits for that
// stream; a non-blocking one returns once queued (truly asynchronous only for pinned host
// memory). Between two GPUs the copy also waits for the destination's current stream first
// and is always blocking, so neither device's stream sees the other's memory early.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool non_blocking) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  check_device(dst_device, "copy");
  check_device(src_device, "copy");
  const int device = src_device.is_cuda() ? src_device.index : dst_device.index;
  const bool cross = src_device.is_cuda() && dst_device.is_cuda() && src_device.index != dst_device.index;
  const bool touches_host = src_device.is_cpu() || dst_device.is_cpu();
  bool capturing = false;
  if (cuda::capture_underway(device)) {
    capturing = cuda::stream_capturing(cuda::current_stream(device));
    STRATA_CHECK(!capturing || (!touches_host && !cross),
                 "[copy] a copy from {} to {} cannot be captured in a CUDA graph: it waits for the device (as "
                 ".item(), .to(kCPU) and copies of host data do), and a replay would reuse the host buffer of the "
                 "capture; copy new data into a static device tensor before replay()",
                 src_device, dst_device);
  }
  if (cross) {
    cuda::DeviceGuard guard(dst_device.index);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream(dst_device.index)), "copy");
  }
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "copy");
  if (capturing) return;  // a device copy in a graph: the graph's order is all it needs
  if (!non_blocking || cross) {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream), "copy");
    return;
  }
  // The copy may still read or write a pinned buffer after its tensor is freed: the cache
  // holds the buffer back until the stream passes this point (ignored for pageable memory).
  const void* host = src_device.is_cpu() ? src : dst_device.is_cpu() ? dst : nullptr;
  if (host) pinned()->cache().record_stream(host, device, reinterpret_cast<detail::StreamId>(stream));
}

}  // namespace backend
}  // namespace strata
