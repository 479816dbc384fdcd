// cuBLAS and cuBLASLt resources for the GEMM launchers (src/ops/cuda/matmul.cpp): handles per
// (device, thread), created at first use, and one workspace per (device, stream, handles) from
// the caching device allocator. See Note [BLAS handles and workspaces] in blas.cpp.
#pragma once

#include <cstddef>
#include <string_view>

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace strata::cuda {

/// Bytes of each GEMM workspace, shared by the cuBLASLt and cuBLAS calls of one thread's handles
/// on one stream.
inline constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

struct BlasHandles {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
};

/// The calling thread's handles for `device` (a valid index, and the current device).
/// Errors name `op`.
BlasHandles blas_handles(int device, std::string_view op);

/// The GEMM workspace of (device, stream, handles): kBlasWorkspaceBytes of device memory used
/// only by work queued on `stream` through `handles` (the calling thread's), made on `stream`,
/// which must be the device's current stream when first asked for.
void* blas_workspace(int device, cudaStream_t stream, const BlasHandles& handles, std::string_view op);

}  // namespace strata::cuda
