// Graph-capture awareness for the CUDA runtime files and launchers (internal; the public API
// is <strata/core/cuda_graph.hpp>). A call that would wait for the device, or bake a value
// into the graph that each replay should renew, checks here first and raises an Error naming
// itself, instead of letting CUDA invalidate the capture with a generic error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_runtime_api.h>

namespace strata {
class Generator;
}

namespace strata::cuda {

/// Whether `stream` is capturing a graph now.
bool stream_capturing(cudaStream_t stream);
/// Whether the calling thread is capturing a graph (with strata's Graph).
bool this_thread_capturing();
/// Whether a strata Graph is capturing on `device`, on any thread.
bool capture_underway(int device);

/// Raises "[op] <what> cannot be captured in a CUDA graph: <why>" when `stream` is capturing.
void check_not_capturing(cudaStream_t stream, const char* op, const char* what, const char* why);

/// For a random kernel about to be captured on `device` by this thread's Graph: a device
/// pointer to {seed, offset} that the graph refills before each replay with a fresh draw of
/// `blocks` Philox counters from `gen` (Note [Graph random draws] in graph.cpp). Raises when
/// the capture is not one this thread began with strata's Graph.
const uint64_t* graph_philox_state(Generator* gen, uint64_t blocks, int device, const char* op);

/// During this thread's capture on `device`: `bytes` of device memory in the graph's pool
/// that replay() rewrites before each launch with what `refill` writes into a host buffer of
/// that size (Note [Graph replay slots] in graph.cpp); `refill` may also advance host state.
/// With 0 bytes, returns nullptr and `refill(nullptr)` just runs at each replay. Raises when
/// the capture is not one this thread began with strata's Graph.
void* graph_replay_slot(size_t bytes, int device, std::function<void(void*)> refill, const char* op);

/// Makes the calling thread's capture mode relaxed for its lifetime, so a call that CUDA
/// would refuse during someone's capture (cudaMalloc for a new segment) may run; it must not
/// touch a capturing stream.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace strata::cuda
