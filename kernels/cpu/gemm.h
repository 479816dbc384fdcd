// Batched GEMM on raw pointers, the one CPU entry point every matmul goes through:
//   C[b] = alpha * A[b] * B[b] + beta * C[b]   for b in [0, batch)
// with A[b] (m, k), B[b] (k, n) and C[b] (m, n). Each operand is a row-major matrix with a
// leading dimension, optionally stored transposed, and a batch stride (0: one matrix shared
// by every batch). gemm() picks the backend: oneDNN where it has a fast kernel for the
// dtype (f32, bf16), Eigen for the rest and for tiny problems.
#pragma once

#include <cstdint>

#include "../common/half.h"

namespace strata::cpu {

enum class GemmType : uint8_t { F32, F64, F16, BF16, I8, U8, I32, I64 };

constexpr int gemm_type_size(GemmType t) {
  switch (t) {
    case GemmType::F64: case GemmType::I64: return 8;
    case GemmType::F32: case GemmType::I32: return 4;
    case GemmType::F16: case GemmType::BF16: return 2;
    case GemmType::I8: case GemmType::U8: return 1;
  }
  return 0;
}

/// Calls f(T{}) with the C++ element type of t.
template <class F>
decltype(auto) visit_gemm_type(GemmType t, F&& f) {
  switch (t) {
    case GemmType::F64: return f(double{});
    case GemmType::F16: return f(Half{});
    case GemmType::BF16: return f(BFloat16{});
    case GemmType::I8: return f(int8_t{});
    case GemmType::U8: return f(uint8_t{});
    case GemmType::I32: return f(int32_t{});
    case GemmType::I64: return f(int64_t{});
    case GemmType::F32: break;
  }
  return f(float{});
}

/// One input matrix (rows, cols) of the product. Element (i, j) of batch b is at
///   data[b * batch_stride + i * ld + j]   when !trans,
///   data[b * batch_stride + j * ld + i]   when trans (stored as its transpose).
/// ld must be at least the stored row length (cols, or rows when trans), and at least 1.
struct GemmInput {
  const void* data = nullptr;
  int64_t ld = 1;
  int64_t batch_stride = 0;
  bool trans = false;
};

/// The output matrix: element (i, j) of batch b is at data[b * batch_stride + i * ld + j].
struct GemmOutput {
  void* data = nullptr;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

struct GemmProblem {
  GemmType type = GemmType::F32;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  GemmInput a;   // (m, k)
  GemmInput b;   // (k, n)
  GemmOutput c;  // (m, n); not read when beta == 0
  double alpha = 1;
  double beta = 0;
};

/// Runs the problem on the calling thread's OpenMP team. Integer types wrap on overflow,
/// as PyTorch's integer matmul does; f16 and bf16 accumulate in f32.
void gemm(const GemmProblem& p);

/// oneDNN backend: returns false, having done nothing, when oneDNN is absent from the build
/// or has no fast kernel for the problem (dtype, layout); the caller then uses Eigen.
bool gemm_dnnl(const GemmProblem& p);

/// Eigen backend for f32, f64 and the integer types (gemm() turns f16/bf16 into f32).
void gemm_eigen(const GemmProblem& p);

/// Number of cached oneDNN primitives (0 without oneDNN); for tests of the cache bound.
int64_t gemm_dnnl_cache_size();

/// c (m, n) int32 = a (m, k) uint8 . b (n, k)^T int8, row-major and dense, exactly, by oneDNN's
/// integer GEMM; false, having written nothing, without oneDNN or where its sums could saturate
/// (no VNNI: see dnnl_cache.h).
bool gemm_u8s8s32_dnnl(const uint8_t* a, const int8_t* b, int32_t* c, int64_t m, int64_t n, int64_t k);

}  // namespace strata::cpu
