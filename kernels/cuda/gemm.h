// Batched GEMM on the GPU, the one CUDA entry point every matmul and linear goes through:
//   C[b] = epilogue(A[b] * B[b])   for b in [0, batch)
// with A[b] (m, k), B[b] (k, n) and C[b] (m, n), row-major operands described as in
// kernels/cpu/gemm.h (a leading dim, optionally stored transposed, a batch stride; 0 shares
// one matrix across the batch). It runs cuBLASLt (tensor cores for f16/bf16, and for f32
// when TF32 is allowed; f32 accumulation for every 16-bit type), with the epilogue fused
// where cuBLASLt offers it; legacy cuBLAS where cuBLASLt finds no algorithm; and a small
// kernel (gemm_epilogue.cu) for an epilogue neither library applied, and for k == 0.
// Everything is queued on ctx.stream; nothing synchronizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace strata::cuda_kernels {

enum class GemmType : uint8_t { F32, F64, F16, BF16 };

/// What happens to each element of A * B before it is stored.
enum class GemmEpilogue : uint8_t {
  None,
  Bias,      // + bias[j]
  Gelu,      // GELU, tanh approximation
  GeluBias,  // GELU(x + bias[j])
};

struct GemmInput {  // element (i, j) of batch b: data[b * batch_stride + (trans ? j * ld + i : i * ld + j)]
  const void* data = nullptr;
  int64_t ld = 1;
  int64_t batch_stride = 0;
  bool trans = false;
};

struct GemmOutput {  // element (i, j) of batch b: data[b * batch_stride + i * ld + j]; must not overlap A or B
  void* data = nullptr;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

struct GemmProblem {
  GemmType type = GemmType::F32;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  GemmInput a;   // (m, k)
  GemmInput b;   // (k, n)
  GemmOutput c;  // (m, n)
  GemmEpilogue epilogue = GemmEpilogue::None;
  const void* bias = nullptr;  // (n) contiguous, of `type`; with Bias and GeluBias
  bool allow_tf32 = false;     // f32 only: TF32 tensor cores
};

/// The per-(device, thread) handles, the stream and a workspace on it.
struct GemmContext {
  int device = 0;                   // the current device, whose handles these are
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;    // for the fallback; bound to stream/workspace on use
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;        // device memory used only by work queued on `stream`
  size_t workspace_bytes = 0;
};

/// The outcome of gemm(): success, or the failing call with its status.
struct GemmStatus {
  const char* call = nullptr;  // null on success
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  cudaError_t cuda = cudaSuccess;  // for the epilogue kernel's launch
  bool ok() const { return call == nullptr; }
};

/// Runs the problem (see the top of this file). Shapes past cuBLAS's 32-bit limits are split
/// into several calls. Descriptors and the chosen algorithm are cached per problem signature
/// on the calling thread.
GemmStatus gemm(const GemmProblem& p, const GemmContext& ctx);

/// Entries in the calling thread's cache of cuBLASLt plans (for tests of the cache).
int64_t gemm_plan_cache_size();

/// The epilogue kernel (gemm_epilogue.cu): c = epilogue(zero ? 0 : c) over `batch` (m, n)
/// matrices, in float32 (float64 for F64), rounded once.
cudaError_t gemm_epilogue(GemmType type, int64_t batch, int64_t m, int64_t n, void* c, int64_t ldc,
                          int64_t batch_stride, const void* bias, bool gelu, bool zero, cudaStream_t stream);

}  // namespace strata::cuda_kernels
