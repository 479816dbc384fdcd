// gemm(): picks the backend for a problem. f32 goes to oneDNN unless the problem is tiny
// (where a call's fixed cost dominates and Eigen is faster), bf16 to oneDNN's bf16 kernel
// when the CPU has one, f16 (and bf16 without it) through f32 copies; f64 and the integer
// types to Eigen. k == 0 only scales C.
#include <algorithm>
#include <vector>

#include "gemm.h"
#include "parallel.h"

namespace strata::cpu {

namespace {

// Below this many multiply-adds (all batches together) a oneDNN call costs more than
// Eigen's whole product: measured on 2 AVX-512 cores, Eigen wins up to 40^3 (1.8 us vs
// 4.8 us) and loses from 48^3 on, for single and batched products alike.
constexpr int64_t kSmallGemm = 40 * 40 * 40;

// C = beta * C (zero when beta == 0, without reading C).
void scale_output(const GemmProblem& p) {
  visit_gemm_type(p.type, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* c = static_cast<T*>(p.c.data);
    const C beta = static_cast<C>(p.beta);
    parallel_for(0, p.batch * p.m, std::max<int64_t>(1, kDefaultGrain / p.n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* row = c + (r / p.m) * p.c.batch_stride + (r % p.m) * p.c.ld;
        for (int64_t j = 0; j < p.n; ++j) row[j] = beta == C(0) ? T(C(0)) : T(static_cast<C>(row[j]) * beta);
      }
    });
  });
}

// Copies `batches` stored matrices of (rows, cols) with leading dim ld into a packed f32
// buffer; `to_f32 == false` copies back from the buffer into the strided matrices.
template <class T>
void convert_rows(T* strided, float* packed, int64_t batches, int64_t batch_stride, int64_t rows, int64_t cols,
                  int64_t ld, bool to_f32) {
  parallel_for(0, batches * rows, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(cols, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   T* s = strided + (r / rows) * batch_stride + (r % rows) * ld;
                   float* d = packed + r * cols;
                   if (to_f32) for (int64_t j = 0; j < cols; ++j) d[j] = static_cast<float>(s[j]);
                   else for (int64_t j = 0; j < cols; ++j) s[j] = T(d[j]);
                 }
               });
}

// An input in f32, packed in its stored orientation: returns the f32 operand.
template <class T>
GemmInput input_as_f32(const GemmInput& in, int64_t batch, int64_t rows, int64_t cols, std::vector<float>& buf) {
  const int64_t nb = in.batch_stride == 0 ? 1 : batch;
  const int64_t sr = in.trans ? cols : rows, sc = in.trans ? rows : cols;
  buf.resize(static_cast<size_t>(nb * sr * sc));
  convert_rows(const_cast<T*>(static_cast<const T*>(in.data)), buf.data(), nb, in.batch_stride, sr, sc, in.ld, true);
  return GemmInput{buf.data(), std::max<int64_t>(sc, 1), in.batch_stride == 0 ? 0 : sr * sc, in.trans};
}

template <class T>
void gemm_through_f32(const GemmProblem& p) {
  std::vector<float> a, b, c(static_cast<size_t>(p.batch * p.m * p.n));
  GemmProblem q = p;
  q.type = GemmType::F32;
  q.a = input_as_f32<T>(p.a, p.batch, p.m, p.k, a);
  q.b = input_as_f32<T>(p.b, p.batch, p.k, p.n, b);
  q.c = GemmOutput{c.data(), p.n, p.m * p.n};
  T* out = static_cast<T*>(p.c.data);
  if (p.beta != 0) convert_rows(out, c.data(), p.batch, p.c.batch_stride, p.m, p.n, p.c.ld, true);
  gemm(q);
  convert_rows(out, c.data(), p.batch, p.c.batch_stride, p.m, p.n, p.c.ld, false);
}

}  // namespace

void gemm(const GemmProblem& p) {
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return;
  if (p.k <= 0) return scale_output(p);
  switch (p.type) {
    case GemmType::F32:
      if (p.batch * p.m * p.n * p.k <= kSmallGemm || !gemm_dnnl(p)) gemm_eigen(p);
      return;
    case GemmType::BF16:
      if (!gemm_dnnl(p)) gemm_through_f32<BFloat16>(p);
      return;
    case GemmType::F16:
      return gemm_through_f32<Half>(p);
    default:
      return gemm_eigen(p);
  }
}

}  // namespace strata::cpu
