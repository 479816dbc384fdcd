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

// A Philox draw passes the generator's seed and offset to its kernel by value: captured in a
// graph, every replay would repeat the captured numbers, so random ops refuse capture.
inline void check_random_not_captured(cudaStream_t stream, const char* op) {
  cuda::check_not_capturing(stream, op, "a random draw",
                            "its kernel takes the generator's seed and offset by value, so every replay would repeat "
                            "the same random numbers; keep random ops (dropout, rand, randn, randint, attention "
                            "dropout) outside the graph");
}

}  // namespace strata::cuda_launch
