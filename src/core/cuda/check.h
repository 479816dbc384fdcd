// The one check for CUDA runtime calls: a failure raises strata::Error naming the op, the
// call and CUDA's error string, "[copy] cudaMemcpyAsync(...) failed: invalid argument".
// STRATA_CUBLAS_CHECK does the same for cuBLAS and cuBLASLt calls (cublasStatus_t).
#pragma once

#include <cstdio>

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <strata/core/error.hpp>

#define STRATA_CUDA_CHECK(call, op)                                                                  \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    STRATA_CHECK(err_ == cudaSuccess, "[{}] {} failed: {}", op, #call, cudaGetErrorString(err_)); \
  } while (0)

#define STRATA_CUBLAS_CHECK(call, op)                                                                   \
  do {                                                                                                 \
    cublasStatus_t status_ = (call);                                                                   \
    STRATA_CHECK(status_ == CUBLAS_STATUS_SUCCESS, "[{}] {} failed: {}", op, #call,                     \
                 cublasGetStatusString(status_));                                                      \
  } while (0)

/// For paths that cannot raise (deallocation from destructors): the same message, on stderr.
#define STRATA_CUDA_WARN(call, op)                                                         \
  do {                                                                                     \
    cudaError_t err_ = (call);                                                             \
    if (err_ != cudaSuccess)                                                               \
      fmt::print(stderr, "[{}] {} failed: {}\n", op, #call, cudaGetErrorString(err_));      \
  } while (0)
