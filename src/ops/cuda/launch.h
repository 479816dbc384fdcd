// Shared by the CUDA launchers in src/ops/cuda: the stream a launch goes on and the check
// that turns a failed launch into an Error naming the op.
#pragma once

#include <string_view>

#include <strata/core/cuda.hpp>
#include <strata/core/tensor.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/stream.h"

namespace strata::cuda_launch {

// The stream kernels for tensors on `t`'s device go on (a StreamGuard's, else the default).
inline cudaStream_t stream_for(const Tensor& t) { return cuda::current_stream(t.device().index); }

inline void check_launch(cudaError_t err, std::string_view op) {
  STRATA_CHECK(err == cudaSuccess, "[{}] CUDA kernel launch failed: {}", op, cudaGetErrorString(err));
}

// The device-side start of a Philox draw of `blocks` counters from `gen` for a kernel on
// `t`'s device: nullptr outside capture (the kernel takes seed and offset by value), else the
// capturing graph's slot, redrawn on each replay (Note [Graph random draws] in graph.cpp).
inline const uint64_t* philox_state(const Tensor& t, Generator* gen, uint64_t blocks, const char* op) {
  const int device = t.device().index;
  if (!cuda::capture_underway(device) || !cuda::stream_capturing(cuda::current_stream(device))) return nullptr;
  return cuda::graph_philox_state(gen, blocks, device, op);
}

// Ops whose random draws cannot yet be redrawn per replay refuse capture.
inline void check_random_not_captured(cudaStream_t stream, const char* op) {
  cuda::check_not_capturing(stream, op, "a random draw",
                            "its kernels take the generator's seed and offset by value, so every replay would repeat "
                            "the same random numbers; keep it outside the graph");
}

}  // namespace strata::cuda_launch
