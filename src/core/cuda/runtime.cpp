// The CUDA device backend: device discovery, plain cudaMalloc device memory, page-locked
// host memory and byte copies. (The caching device allocator and streams grow here.)
#include <cstring>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include <strata/core/error.hpp>

#include "core/backend.h"

#define STRATA_CUDA_CHECK(call, op)                                                                  \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    STRATA_CHECK(err_ == cudaSuccess, "[{}] {} failed: {}", op, #call, cudaGetErrorString(err_)); \
  } while (0)

namespace strata {

namespace cuda {
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}
bool is_available() { return device_count() > 0; }
}  // namespace cuda

namespace {

class StatsCounter {
 public:
  void on_alloc(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use += static_cast<int64_t>(n);
    stats_.bytes_reserved += static_cast<int64_t>(n);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    ++stats_.num_allocs;
    ++stats_.num_system_allocs;
  }
  void on_free(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use -= static_cast<int64_t>(n);
    stats_.bytes_reserved -= static_cast<int64_t>(n);
    ++stats_.num_frees;
  }
  MemoryStats get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

class CudaDeviceAllocator final : public Allocator {
 public:
  explicit CudaDeviceAllocator(int index) : index_(index) {}
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    int prev = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&prev), "cuda allocator");
    STRATA_CUDA_CHECK(cudaSetDevice(index_), "cuda allocator");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, nbytes);
    cudaSetDevice(prev);
    if (err != cudaSuccess) {
      cudaGetLastError();
      MemoryStats s = counter_.get();
      detail::throw_error("[cuda allocator] out of memory on cuda:{} allocating {} bytes ({} in use, {} reserved): {}",
                          index_, nbytes, s.bytes_in_use, s.bytes_reserved, cudaGetErrorString(err));
    }
    counter_.on_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    cudaFree(ptr);
    counter_.on_free(nbytes);
  }
  MemoryStats stats() const override { return counter_.get(); }
  void reset_peak() override { counter_.reset_peak(); }
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
  StatsCounter counter_;
};

class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault), "pinned allocator");
    counter_.on_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    cudaFreeHost(ptr);
    counter_.on_free(nbytes);
  }
  MemoryStats stats() const override { return counter_.get(); }
  void reset_peak() override { counter_.reset_peak(); }
  Device device() const override { return kCPU; }

 private:
  StatsCounter counter_;
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
  static std::once_flag once;
  static std::vector<CudaDeviceAllocator*> per_device;
  std::call_once(once, [] {
    for (int i = 0; i < cuda::device_count(); ++i) per_device.push_back(new CudaDeviceAllocator(i));
  });
  return *per_device[device.index];
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool non_blocking) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  check_device(dst_device, "copy");
  check_device(src_device, "copy");
  // Until user streams exist every copy is ordered on the legacy default stream; a
  // non-blocking copy returns once it is queued.
  if (non_blocking) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, nullptr), "copy");
  } else {
    STRATA_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault), "copy");
  }
}

}  // namespace backend
}  // namespace strata
