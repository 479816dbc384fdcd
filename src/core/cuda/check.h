// The one check for CUDA runtime calls: a failure raises strata::Error naming the op, the
// call and CUDA's error string, "[copy] cudaMemcpyAsync(...) failed: invalid argument".
#pragma once

#include <cstdio>

#include <cuda_runtime_api.h>

#include <strata/core/error.hpp>

#define STRATA_CUDA_CHECK(call, op)                                                                  \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    STRATA_CHECK(err_ == cudaSuccess, "[{}] {} failed: {}", op, #call, cudaGetErrorString(err_)); \
  } while (0)

/// For paths that cannot raise (deallocation from destructors): the same message, on stderr.
#define STRATA_CUDA_WARN(call, op)                                                         \
  do {                                                                                     \
    cudaError_t err_ = (call);                                                             \
    if (err_ != cudaSuccess)                                                               \
      fmt::print(stderr, "[{}] {} failed: {}\n", op, #call, cudaGetErrorString(err_));      \
  } while (0)
