// The pointer-level GEMM of kernels/cpu/gemm.h on its own, against a float64 loop over the
// same layout rules: both orientations of each operand, padded leading dims, batch strides
// (including a shared operand), alpha and beta (C never read when beta == 0), every type,
// and the bound on the oneDNN primitive cache.
#include <cmath>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/gemm.h"

using namespace strata;
using namespace strata::cpu;

namespace {

struct Layout {
  bool trans_a = false, trans_b = false;
  int64_t pad = 0;     // extra elements per stored row, for every operand
  bool shared_b = false;  // B has batch stride 0
};

// One problem with its buffers (as float64, converted to the type when run).
struct Problem {
  GemmProblem p;
  std::vector<double> a, b, c;
  int64_t rows_a, rows_b;  // stored rows per batch
};

Problem make(GemmType type, int64_t batch, int64_t m, int64_t n, int64_t k, Layout l, double alpha, double beta,
           std::mt19937& rng) {
  Problem s;
  GemmProblem& p = s.p;
  p.type = type;
  p.batch = batch, p.m = m, p.n = n, p.k = k, p.alpha = alpha, p.beta = beta;
  p.a.trans = l.trans_a, p.b.trans = l.trans_b;
  p.a.ld = (l.trans_a ? m : k) + l.pad;
  p.b.ld = (l.trans_b ? k : n) + l.pad;
  p.c.ld = n + l.pad;
  s.rows_a = l.trans_a ? k : m;
  s.rows_b = l.trans_b ? n : k;
  p.a.batch_stride = s.rows_a * p.a.ld;
  p.b.batch_stride = l.shared_b ? 0 : s.rows_b * p.b.ld;
  p.c.batch_stride = m * p.c.ld;
  const bool integral = type == GemmType::I8 || type == GemmType::U8 || type == GemmType::I32 || type == GemmType::I64;
  std::uniform_int_distribution<int> small(type == GemmType::U8 ? 0 : -3, 3);
  std::uniform_real_distribution<double> real(-1, 1);
  auto fill = [&](std::vector<double>& v, size_t count) {
    v.resize(count);
    for (double& x : v) x = integral ? small(rng) : real(rng);
  };
  fill(s.a, static_cast<size_t>(batch * p.a.batch_stride));
  fill(s.b, static_cast<size_t>(l.shared_b ? p.b.ld * s.rows_b : batch * p.b.batch_stride));
  fill(s.c, static_cast<size_t>(batch * p.c.batch_stride));
  return s;
}

// Runs the problem in its type and returns C as float64.
std::vector<double> run(Problem s) {
  return visit_gemm_type(s.p.type, [&](auto tag) {
    using T = decltype(tag);
    auto to_t = [](const std::vector<double>& v) {
      std::vector<T> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = T(static_cast<compute_t<T>>(v[i]));
      return out;
    };
    std::vector<T> a = to_t(s.a), b = to_t(s.b), c = to_t(s.c);
    if (s.p.beta == 0) {  // C must not be read: poison it
      for (auto& x : c) {
        if constexpr (std::is_integral_v<T>) x = T(77);
        else x = T(std::numeric_limits<float>::quiet_NaN());
      }
    }
    GemmProblem p = s.p;
    p.a.data = a.data(), p.b.data = b.data(), p.c.data = c.data();
    gemm(p);
    std::vector<double> out(c.size());
    for (size_t i = 0; i < c.size(); ++i) out[i] = static_cast<double>(static_cast<compute_t<T>>(c[i]));
    return out;
  });
}

// The values the buffers hold once rounded to the type (what the GEMM actually reads).
std::vector<double> rounded(const std::vector<double>& v, GemmType type) {
  return visit_gemm_type(type, [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<compute_t<T>>(T(static_cast<compute_t<T>>(v[i]))));
    return out;
  });
}

void check(const Problem& s, const std::vector<double>& got, double tol) {
  const GemmProblem& p = s.p;
  std::vector<double> a = rounded(s.a, p.type), b = rounded(s.b, p.type), c0 = rounded(s.c, p.type);
  for (int64_t bi = 0; bi < p.batch; ++bi)
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.c.ld; ++j) {
        const int64_t at = bi * p.c.batch_stride + i * p.c.ld + j;
        if (j >= p.n) {  // padding between rows of C stays as it was
          if (p.beta != 0) ASSERT_EQ(got[at], c0[at]) << "padding at " << at;
          continue;
        }
        double sum = 0, bound = 0;
        for (int64_t q = 0; q < p.k; ++q) {
          double x = a[bi * p.a.batch_stride + (p.a.trans ? q * p.a.ld + i : i * p.a.ld + q)];
          double y = b[bi * p.b.batch_stride + (p.b.trans ? j * p.b.ld + q : q * p.b.ld + j)];
          sum += x * y;
          bound += std::fabs(x * y);
        }
        double want = p.alpha * sum + (p.beta != 0 ? p.beta * c0[at] : 0);
        bound = std::fabs(p.alpha) * bound + std::fabs(p.beta * c0[at]);
        // 8-bit results wrap, as the integer product does in PyTorch
        if (p.type == GemmType::I8) want = static_cast<int8_t>(static_cast<uint8_t>(std::llround(want) & 0xff));
        if (p.type == GemmType::U8) want = static_cast<uint8_t>(std::llround(want) & 0xff);
        ASSERT_LE(std::fabs(got[at] - want), tol * bound + 1e-300)
            << "batch " << bi << " (" << i << ", " << j << "): got " << got[at] << ", want " << want;
      }
}

double tol_for(GemmType t, int64_t k) {
  switch (t) {
    case GemmType::F64: return 4e-16 * static_cast<double>(k + 2);
    case GemmType::F32: return 2.4e-7 * static_cast<double>(k + 2);
    case GemmType::F16: return 1.2e-7 * static_cast<double>(k + 2) + 1e-3;
    case GemmType::BF16: return 1.2e-7 * static_cast<double>(k + 2) + 8e-3;
    default: return 0;
  }
}

}  // namespace

TEST(Gemm, LayoutsAlphaBetaAndBatchStrides) {
  std::mt19937 rng(1);
  const GemmType types[] = {GemmType::F32, GemmType::F64, GemmType::F16, GemmType::BF16,
                            GemmType::I32, GemmType::I64, GemmType::I8,  GemmType::U8};
  struct Size { int64_t batch, m, n, k; };
  // tiny (Eigen) and larger (oneDNN for f32/bf16) problems, odd sizes
  const Size sizes[] = {{1, 1, 1, 1}, {1, 7, 5, 3}, {3, 33, 17, 9}, {1, 64, 48, 80}, {2, 65, 33, 129}};
  const std::pair<double, double> scales[] = {{1, 0}, {0.5, 0}, {1, 1}, {-2, 0.25}};
  for (GemmType t : types)
    for (const Size& z : sizes)
      for (int mask = 0; mask < 16; ++mask)
        for (auto [alpha, beta] : scales) {
          const bool integral = t == GemmType::I8 || t == GemmType::U8 || t == GemmType::I32 || t == GemmType::I64;
          if (integral && (alpha != std::round(alpha) || beta != std::round(beta))) continue;
          Layout l{(mask & 1) != 0, (mask & 2) != 0, (mask & 4) ? 3 : 0, (mask & 8) != 0};
          Problem s = make(t, z.batch, z.m, z.n, z.k, l, alpha, beta, rng);
          SCOPED_TRACE(::testing::Message() << "type " << int(t) << " batch " << z.batch << " m " << z.m << " n "
                                            << z.n << " k " << z.k << " mask " << mask << " alpha " << alpha
                                            << " beta " << beta);
          check(s, run(s), tol_for(t, z.k));
          if (::testing::Test::HasFatalFailure()) return;
        }
}

TEST(Gemm, IntegerProductsWrap) {
  // 100 * 100 * 3 = 30000 wraps in int8 (30000 mod 256 = 48)
  std::vector<int8_t> a(3, 100), b(3, 100), c(1, 0);
  GemmProblem p;
  p.type = GemmType::I8;
  p.m = 1, p.n = 1, p.k = 3;
  p.a = GemmInput{a.data(), 3, 0, false};
  p.b = GemmInput{b.data(), 1, 0, false};
  p.c = GemmOutput{c.data(), 1, 0};
  gemm(p);
  EXPECT_EQ(c[0], static_cast<int8_t>(30000 & 0xff));
}

TEST(Gemm, ZeroInnerDimScalesC) {
  std::vector<float> c(6, 2.0f);
  GemmProblem p;
  p.m = 2, p.n = 3, p.k = 0, p.beta = 0.5;
  p.c = GemmOutput{c.data(), 3, 0};
  gemm(p);
  EXPECT_EQ(c, std::vector<float>(6, 1.0f));
  p.beta = 0;
  gemm(p);
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
}

TEST(Gemm, PrimitiveCacheIsBounded) {
  std::vector<float> a(64 * 64, 1), b(64 * 64, 1), c(64 * 64);
  for (int64_t n = 1; n <= 300; ++n) {  // 300 alphas: 300 distinct primitives
    GemmProblem p;
    p.m = 64, p.k = 64, p.n = 64;
    p.a = GemmInput{a.data(), 64, 0, false};
    p.b = GemmInput{b.data(), 64, 0, false};
    p.c = GemmOutput{c.data(), 64, 0};
    p.alpha = static_cast<double>(n);
    gemm(p);
    EXPECT_EQ(c[0], 64.0f * static_cast<float>(n));
  }
  EXPECT_LE(gemm_dnnl_cache_size(), 256);
#if defined(STRATA_HAVE_DNNL)
  EXPECT_GT(gemm_dnnl_cache_size(), 0);
#endif
}
