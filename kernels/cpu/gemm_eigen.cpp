// The Eigen GEMM backend: f32, f64 and the integer types, any leading dimension and either
// orientation of each operand, mapped in place (no copies). A batch runs its matrices on
// separate OpenMP threads; a single matrix uses Eigen's own OpenMP-parallel GEMM.
#include <algorithm>

// GCC 12 reports false "may be used uninitialized" warnings inside Eigen's AVX-512 kernels
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>

#include "gemm.h"
#include "parallel.h"

namespace strata::cpu {

namespace {

using Eigen::ColMajor;
using Eigen::Dynamic;
using Eigen::OuterStride;
using Eigen::RowMajor;
using Eigen::Unaligned;

template <class T, int Order>
using InMap = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Order>, Unaligned, OuterStride<>>;
template <class T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, RowMajor>, Unaligned, OuterStride<>>;

template <class T, class A, class B>
void product(const A& a, const B& b, OutMap<T>& c, T alpha, T beta) {
  if (beta == T(0)) {
    // C is not read, so NaNs or garbage in it do not leak into the result
    if (alpha == T(1)) c.noalias() = a * b;
    else c.noalias() = alpha * (a * b);
    return;
  }
  if (beta != T(1)) c *= beta;
  if (alpha == T(1)) c.noalias() += a * b;
  else c.noalias() += alpha * (a * b);
}

template <class T>
void one_matrix(const GemmProblem& p, const T* a, const T* b, T* c) {
  const T alpha = static_cast<T>(p.alpha), beta = static_cast<T>(p.beta);
  OutMap<T> cm(c, p.m, p.n, OuterStride<>(p.c.ld));
  auto with_b = [&](const auto& am) {
    if (p.b.trans) product(am, InMap<T, ColMajor>(b, p.k, p.n, OuterStride<>(p.b.ld)), cm, alpha, beta);
    else product(am, InMap<T, RowMajor>(b, p.k, p.n, OuterStride<>(p.b.ld)), cm, alpha, beta);
  };
  if (p.a.trans) with_b(InMap<T, ColMajor>(a, p.m, p.k, OuterStride<>(p.a.ld)));
  else with_b(InMap<T, RowMajor>(a, p.m, p.k, OuterStride<>(p.a.ld)));
}

template <class T>
void run(const GemmProblem& p) {
  const T* a = static_cast<const T*>(p.a.data);
  const T* b = static_cast<const T*>(p.b.data);
  T* c = static_cast<T*>(p.c.data);
  if (p.batch == 1) {
    one_matrix(p, a, b, c);
    return;
  }
  // enough matrices per thread that waking a second thread pays off
  const int64_t flops = p.m * p.n * p.k;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(flops, 1));
  parallel_for(0, p.batch, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      one_matrix(p, a + i * p.a.batch_stride, b + i * p.b.batch_stride, c + i * p.c.batch_stride);
  });
}

}  // namespace

void gemm_eigen(const GemmProblem& p) {
  switch (p.type) {
    case GemmType::F32: return run<float>(p);
    case GemmType::F64: return run<double>(p);
    case GemmType::I8: return run<int8_t>(p);
    case GemmType::U8: return run<uint8_t>(p);
    case GemmType::I32: return run<int32_t>(p);
    case GemmType::I64: return run<int64_t>(p);
    case GemmType::F16: case GemmType::BF16: break;  // gemm() converts these to f32 first
  }
}

}  // namespace strata::cpu
