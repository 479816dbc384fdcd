// The CUDA device backend of core (src/core/backend.h): the device allocators, page-locked
// host memory and byte copies ordered on the current stream.
#include <cstring>
#include <mutex>

#include <strata/core/cuda.hpp>

#include "core/backend.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"
#include "core/cuda/stream.h"

namespace strata {

namespace {

class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault), "pinned allocator");
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use += static_cast<int64_t>(nbytes);
    stats_.bytes_reserved += static_cast<int64_t>(nbytes);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    ++stats_.num_allocs;
    ++stats_.num_system_allocs;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    // cudaFreeHost waits for the device, so an async copy still reading the buffer finishes first.
    STRATA_CUDA_WARN(cudaFreeHost(ptr), "pinned allocator");
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use -= static_cast<int64_t>(nbytes);
    stats_.bytes_reserved -= static_cast<int64_t>(nbytes);
    ++stats_.num_frees;
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  Device device() const override { return kCPU; }

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

}  // namespace

Allocator& pinned_allocator() {
  if (!cuda::is_available()) return cpu_allocator();
  static auto* a = new PinnedAllocator();
  return *a;
}
bool pinned_memory_is_page_locked() { return cuda::is_available(); }

namespace backend {

void check_device(Device device, const char* op) {
  if (device.is_cpu()) return;
  int n = cuda::device_count();
  STRATA_CHECK(device.index >= 0 && device.index < n, "[{}] device {} is not available: {} CUDA device(s) visible", op,
               device, n);
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
  if (cross) {
    cuda::DeviceGuard guard(dst_device.index);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream(dst_device.index)), "copy");
  }
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "copy");
  if (!non_blocking || cross) STRATA_CUDA_CHECK(cudaStreamSynchronize(stream), "copy");
}

}  // namespace backend
}  // namespace strata
