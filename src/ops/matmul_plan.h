// How the launchers of matmul and linear (CPU and CUDA alike) turn broadcast operands into
// calls of a pointer-level batched GEMM: each operand is read in place when its rows or its
// columns are unit-stride (else from a compact copy), the batch dims are coalesced, the
// innermost batch dim runs as one strided-batched call and the rest as an odometer of calls.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <strata/core/tensor.hpp>

#include "kernels/cpu/gemm.h"

namespace strata::detail {

/// The CPU GEMM element type of dtype t; throws "[op] not supported for dtype …" for bool.
inline cpu::GemmType cpu_gemm_type(DType t, std::string_view op) {
  switch (t) {
    case kFloat32: return cpu::GemmType::F32;
    case kFloat64: return cpu::GemmType::F64;
    case kFloat16: return cpu::GemmType::F16;
    case kBFloat16: return cpu::GemmType::BF16;
    case kInt8: return cpu::GemmType::I8;
    case kUInt8: return cpu::GemmType::U8;
    case kInt32: return cpu::GemmType::I32;
    case kInt64: return cpu::GemmType::I64;
    case kBool: break;
  }
  throw_error("[{}] not supported for dtype {}", op, t);
}

/// How a (rows, cols) matrix is read: element (i, j) at i * ld + j, or at j * ld + i when
/// `trans` (stored as its transpose). ld is at least the stored row length, and at least 1.
struct MatrixLayout {
  int64_t ld = 1;
  bool trans = false;
};

/// One batch dim: its size and each operand's stride (elements).
struct BatchDim {
  int64_t size, a, b, c;
};

/// The calls of one product: `batch` products of (m, k) x (k, n) per call, operands at
/// batch strides stride_a, stride_b, stride_c (0: shared), C row-major with leading dim ldc.
struct GemmPlan {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  MatrixLayout a, b;  // meaningless when k == 0
  int64_t ldc = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  std::vector<BatchDim> outer;  // the remaining batch dims, one call per index
};

/// Plans c = a @ b for a (..., m, k), b (..., k, n) and a contiguous c (..., m, n), all with
/// the same batch dims (broadcast ones have stride 0). a or b is replaced by a compact copy
/// when it cannot be read in place.
GemmPlan plan_gemm(Tensor& a, Tensor& b, const Tensor& c);

/// Calls f(offset_a, offset_b, offset_c), the element offsets of one call's operands, for
/// every call of the plan.
template <class F>
void for_each_gemm_call(const GemmPlan& plan, F&& f) {
  const std::vector<BatchDim>& dims = plan.outer;
  std::vector<int64_t> idx(dims.size(), 0);
  int64_t oa = 0, ob = 0, oc = 0;
  while (true) {
    f(oa, ob, oc);
    size_t d = 0;
    for (; d < dims.size(); ++d) {
      oa += dims[d].a, ob += dims[d].b, oc += dims[d].c;
      if (++idx[d] < dims[d].size) break;
      oa -= dims[d].a * dims[d].size, ob -= dims[d].b * dims[d].size, oc -= dims[d].c * dims[d].size;
      idx[d] = 0;
    }
    if (d == dims.size()) break;
  }
}

}  // namespace strata::detail
