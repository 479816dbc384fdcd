// cuDNN handles, one per (device, thread), and the process-wide convolution switches of
// <strata/core/cuda.hpp> (benchmark mode, deterministic algorithms).
#include <atomic>

#include <strata/core/cuda.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/cudnn.h"
#include "core/cuda/internal.h"

namespace strata::cuda {

namespace {

std::atomic<bool> g_benchmark{false};
std::atomic<bool> g_deterministic{false};

// A handle is bound to the device that was current when it was made, and cuDNN handles are
// not safe to share between threads that run at once: hence one per (device, thread).
struct ThreadHandles {
  cudnnHandle_t handle[kMaxDevices] = {};
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    for (cudnnHandle_t h : handle)
      if (h) cudnnDestroy(h);  // status ignored: nothing can be done about it at thread exit
  }
};

}  // namespace

cudnnHandle_t cudnn_handle(int device, cudaStream_t stream, const char* op) {
  STRATA_CHECK(device >= 0 && device < kMaxDevices, "[{}] bad CUDA device index {}", op, device);
  thread_local ThreadHandles handles;
  cudnnHandle_t& h = handles.handle[device];
  if (!h) {
    STRATA_CHECK(!stream_capturing(stream), "[{}] the thread's first cuDNN call cannot be captured in a CUDA graph "
                 "(making its handle allocates device memory): run the step once before capture (a warm-up)", op);
    cudnnHandle_t created = nullptr;
    STRATA_CUDNN_CHECK(cudnnCreate(&created), op);
    h = created;
  }
  STRATA_CUDNN_CHECK(cudnnSetStream(h, stream), op);
  return h;
}

void set_benchmark_mode(bool on) { g_benchmark.store(on, std::memory_order_relaxed); }
bool benchmark_mode() { return g_benchmark.load(std::memory_order_relaxed); }
void set_deterministic(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }

}  // namespace strata::cuda
