// The stream that CUDA kernels launch on, for the launchers in src/ (internal; the public
// Stream/StreamGuard API is in <strata/core/cuda.hpp>). Every launch and async copy goes on
// current_stream(device), so a user's StreamGuard moves all work of the enclosed ops onto
// the user's stream.
#pragma once

#include <cuda_runtime_api.h>

namespace strata::cuda {

/// The calling thread's current stream for `device` (a CUDA device index, >= 0): the
/// stream set by the innermost live StreamGuard for that device, else the device's default
/// stream (the legacy null stream, whose handle is nullptr).
cudaStream_t current_stream(int device);

}  // namespace strata::cuda
