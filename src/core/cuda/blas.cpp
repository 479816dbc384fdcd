// Handles and workspaces for cuBLAS and cuBLASLt, and the TF32 switch of <strata/core/cuda.hpp>.
//
// Note [BLAS handles and workspaces]
// A cuBLAS handle must not be used by two threads at once, so each thread has its own per
// device, made on first use. When a thread ends, its handles go back to a per-device pool for
// the next thread instead of being destroyed: creating one costs milliseconds, and destroying
// handles during static destruction, when CUDA may already be shut down, can crash. So the pool
// lives as long as the process (as in PyTorch).
// Workspaces belong to a stream and a thread's handles. Work on one stream runs in order, but
// one GEMM can be several kernels (a split-K product, then the sum of its partials in the
// workspace), and two threads queueing on one stream interleave them: thread B's product
// overwrote thread A's partials before A's sum read them (seen on an H200, two threads on the
// default stream). With a workspace per handle, which one thread uses at a time, each GEMM's
// kernels have theirs to themselves. Each is a strata Tensor from the caching allocator,
// allocated on its stream and kept for the process's life, as the handles are.
#include "core/cuda/blas.h"

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <cublas_v2.h>

#include <strata/core/cuda.hpp>
#include <strata/core/tensor.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"
#include "core/cuda/stream.h"
#include "core/tensor_internal.h"

namespace strata::cuda {

namespace {

std::atomic<bool> g_allow_tf32{false};  // PyTorch's default since 1.12

struct HandlePool {
  std::mutex mutex;
  std::vector<BlasHandles> free[kMaxDevices];
};

HandlePool& handle_pool() {
  static auto* pool = new HandlePool;  // never destroyed (Note [BLAS handles and workspaces])
  return *pool;
}

// The calling thread's handles, returned to the pool when the thread ends.
struct ThreadHandles {
  BlasHandles device[kMaxDevices];
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (int d = 0; d < kMaxDevices; ++d)
      if (device[d].lt) pool.free[d].push_back(device[d]);
  }
};

thread_local ThreadHandles t_handles;

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

BlasHandles blas_handles(int device, std::string_view op) {
  STRATA_CHECK(device >= 0 && device < kMaxDevices, "[{}] invalid CUDA device index {}", op, device);
  BlasHandles& mine = t_handles.device[device];
  if (mine.lt) return mine;
  {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (!pool.free[device].empty()) {
      mine = pool.free[device].back();
      pool.free[device].pop_back();
      return mine;
    }
  }
  STRATA_CHECK(!this_thread_capturing(), "[{}] the thread's first cuBLAS call cannot be captured in a CUDA graph "
               "(making its handles allocates device memory): run the step once before capture (a warm-up)", op);
  BlasHandles made;
  STRATA_CUBLAS_CHECK(cublasLtCreate(&made.lt), op);
  const cublasStatus_t status = cublasCreate(&made.blas);
  if (status != CUBLAS_STATUS_SUCCESS) {
    cublasLtDestroy(made.lt);
    detail::throw_error("[{}] cublasCreate(&made.blas) failed: {}", op, cublasGetStatusString(status));
  }
  mine = made;
  return mine;
}

void* blas_workspace(int device, cudaStream_t stream, const BlasHandles& handles, std::string_view op) {
  static auto* mutex = new std::mutex;  // both never destroyed (Note [BLAS handles and workspaces])
  static auto* spaces = new std::map<std::tuple<int, cudaStream_t, cublasLtHandle_t>, Tensor>;
  std::lock_guard<std::mutex> lock(*mutex);
  const auto key = std::make_tuple(device, stream, handles.lt);
  auto it = spaces->find(key);
  if (it == spaces->end()) {
    // the allocator gives a block to the current stream, which is then the only one using it
    STRATA_CHECK(current_stream(device) == stream, "[{}] a GEMM workspace must be made on the current stream", op);
    Tensor buffer = detail::make_tensor({static_cast<int64_t>(kBlasWorkspaceBytes)}, kUInt8, Device::cuda(device));
    it = spaces->emplace(key, std::move(buffer)).first;
  }
  return it->second.data();
}

}  // namespace strata::cuda
