// matmul, mm and bmm against a float64 triple-loop reference: 1-d/2-d/N-d semantics, batch
// broadcasting, every dtype, transposed / sliced / permuted inputs (read in place where
// their rows or columns are unit-stride), zero-size dims, concurrency and bad input.
#include <cmath>
#include <thread>

#include "testing.h"

using namespace strata;
using strata::testing::Layout;
using strata::testing::values;

namespace {

struct Ref {
  std::vector<double> value;  // the exact product
  std::vector<double> bound;  // sum of |a| * |b| per element, to scale rounding tolerances
  Shape shape;
};

// PyTorch's matmul semantics on float64 values in C order.
Ref reference(const std::vector<double>& va, Shape sa, const std::vector<double>& vb, Shape sb) {
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch(std::max(ba.size(), bb.size()), 1);
  for (size_t i = 0; i < batch.size(); ++i) {
    size_t ia = i + ba.size() - batch.size(), ib = i + bb.size() - batch.size();
    int64_t x = i + ba.size() >= batch.size() ? ba[ia] : 1, y = i + bb.size() >= batch.size() ? bb[ib] : 1;
    batch[i] = x == 1 ? y : x;
  }
  int64_t nbatch = 1;
  for (int64_t s : batch) nbatch *= s;
  Ref r;
  r.value.assign(static_cast<size_t>(nbatch * m * n), 0);
  r.bound.assign(r.value.size(), 0);
  for (int64_t bi = 0; bi < nbatch; ++bi) {
    auto idx = strata::testing::unravel(bi, batch);
    int64_t ia = strata::testing::broadcast_index(idx, ba), ib = strata::testing::broadcast_index(idx, bb);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, t = 0;
        for (int64_t p = 0; p < k; ++p) {
          double x = va[(ia * m + i) * k + p], y = vb[(ib * k + p) * n + j];
          s += x * y;
          t += std::fabs(x * y);
        }
        r.value[(bi * m + i) * n + j] = s;
        r.bound[(bi * m + i) * n + j] = t;
      }
  }
  r.shape = batch;
  if (!a_vec) r.shape.push_back(m);
  if (!b_vec) r.shape.push_back(n);
  return r;
}

// Integer results wrap to the dtype's width, as PyTorch's integer matmul does.
double wrap(double v, DType t) {
  auto s = static_cast<int64_t>(std::llround(v));
  if (t == kInt8) return static_cast<int8_t>(static_cast<uint8_t>(s & 0xff));
  if (t == kUInt8) return static_cast<uint8_t>(s & 0xff);
  return static_cast<double>(s);
}

// Rounding allowed per unit of sum |a||b|: the accumulation's (k terms) plus the output's.
double tolerance(DType t, int64_t k) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (t) {
    case kFloat64: return 4 * kk * 1.1e-16;
    case kFloat32: return 4 * kk * 6e-8;
    case kFloat16: return 2 * (kk * 6e-8 + 4.9e-4);
    case kBFloat16: return 2 * (kk * 6e-8 + 3.9e-3);
    default: return 0;
  }
}

::testing::AssertionResult matches(const Tensor& got, const Ref& want, DType t, int64_t k) {
  if (got.shape() != want.shape)
    return ::testing::AssertionFailure() << "shape " << fmt::format("{}", got.shape()) << " != "
                                         << fmt::format("{}", want.shape);
  if (got.dtype() != t) return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype());
  std::vector<double> g = values(got);
  const double tol = tolerance(t, k);
  for (size_t i = 0; i < g.size(); ++i) {
    double w = is_integral(t) ? wrap(want.value[i], t) : want.value[i];
    if (!(std::fabs(g[i] - w) <= tol * want.bound[i] + 1e-300))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g[i] << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

Tensor random(const Shape& shape, DType t, Generator& g) {
  if (t == kUInt8) return randint(0, 4, shape, TensorOptions(t), &g);
  if (is_integral(t)) return randint(-3, 4, shape, TensorOptions(t), &g);
  Tensor x = empty(shape, kFloat64);
  uniform_(x, -1, 1, &g);
  return x.to(t);
}

struct Case {
  Shape a, b;
};

// sizes 1, 7, 33, 129; 1-d, 2-d, 3-d and 4-d with broadcast batch dims; zero-size dims
const std::vector<Case> kCases = {
    {{1, 1}, {1, 1}},          {{7, 7}, {7, 7}},           {{33, 33}, {33, 33}},
    {{129, 129}, {129, 129}},  {{7, 33}, {33, 129}},        {{129, 7}, {7, 1}},
    {{1, 33}, {33, 7}},        {{64, 200}, {200, 96}},      {{7}, {7}},
    {{33}, {33, 7}},           {{7, 33}, {33}},             {{5}, {2, 5, 3}},
    {{2, 3, 5}, {5}},          {{3, 7, 33}, {3, 33, 5}},    {{3, 7, 33}, {33, 5}},
    {{4, 40, 50}, {50, 60}},   {{7, 33}, {3, 33, 5}},       {{2, 1, 7, 5}, {1, 3, 5, 6}},
    {{2, 3, 7, 5}, {2, 3, 5, 6}}, {{2, 3, 4, 5}, {3, 5, 4}}, {{2, 1, 40, 50}, {3, 50, 40}},
    {{0, 5}, {5, 3}},          {{4, 0}, {0, 3}},            {{2, 0, 5}, {2, 5, 3}},
    {{0}, {0}},                {{3, 4, 0}, {0, 2}},         {{0, 4, 5}, {5, 2}},
};

const std::vector<DType> kAllTypes = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kInt8, kUInt8};
const Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Sliced};

}  // namespace

TEST(Matmul, MatchesFloat64ReferenceForEveryDtypeAndLayout) {
  Generator g(7);
  for (DType t : kAllTypes) {
    for (const Case& c : kCases) {
      Tensor a0 = random(c.a, t, g), b0 = random(c.b, t, g);
      Ref want = reference(values(a0), c.a, values(b0), c.b);
      int64_t k = c.a.back();
      for (Layout la : kLayouts)
        for (Layout lb : kLayouts) {
          SCOPED_TRACE(fmt::format("{} {} x {} ({}, {})", t, c.a, c.b, strata::testing::layout_name(la),
                                   strata::testing::layout_name(lb)));
          Tensor a = strata::testing::with_layout(a0, la), b = strata::testing::with_layout(b0, lb);
          ASSERT_TRUE(matches(matmul(a, b), want, t, k));
        }
    }
  }
}

TEST(Matmul, ZeroInnerDimGivesZeros) {
  Tensor c = matmul(ones({4, 0}), ones({0, 3}));
  EXPECT_EQ(c.shape(), (Shape{4, 3}));
  EXPECT_EQ(values(c), std::vector<double>(12, 0));
  Tensor d = matmul(ones({0}, kFloat64), ones({0}, kFloat64));
  EXPECT_EQ(d.dim(), 0);
  EXPECT_EQ(d.item<double>(), 0);
  EXPECT_EQ(values(bmm(ones({2, 3, 0}, kInt32), ones({2, 0, 2}, kInt32))), std::vector<double>(12, 0));
}

TEST(Matmul, ConsumerExpression) {
  double sum = 0;
  for (double v : values(strata::matmul(strata::ones({64, 32}), strata::ones({32, 16})))) sum += v;
  EXPECT_EQ(sum, 32768.0);
}

TEST(Matmul, MmBmmAndMethod) {
  Generator g(3);
  Tensor a = random({3, 5, 7}, kFloat32, g), b = random({3, 7, 2}, kFloat32, g);
  Ref want = reference(values(a), a.shape(), values(b), b.shape());
  EXPECT_TRUE(matches(bmm(a, b), want, kFloat32, 7));
  EXPECT_TRUE(matches(a.matmul(b), want, kFloat32, 7));
  Tensor x = random({6, 4}, kFloat64, g), y = random({4, 9}, kFloat64, g);
  EXPECT_TRUE(matches(mm(x, y), reference(values(x), x.shape(), values(y), y.shape()), kFloat64, 4));
}

TEST(Matmul, TypePromotion) {
  Generator g(5);
  struct P { DType a, b, out; };
  for (P p : {P{kInt32, kFloat32, kFloat32}, P{kFloat16, kBFloat16, kFloat32}, P{kInt8, kUInt8, kInt32},
              P{kFloat32, kFloat64, kFloat64}, P{kBool, kFloat32, kFloat32}, P{kInt64, kFloat16, kFloat16}}) {
    Tensor a = p.a == kBool ? ones({5, 6}, kBool) : random({5, 6}, p.a, g);
    Tensor b = random({6, 3}, p.b, g);
    Tensor c = matmul(a, b);
    SCOPED_TRACE(fmt::format("{} x {}", p.a, p.b));
    EXPECT_TRUE(matches(c, reference(values(a), a.shape(), values(b), b.shape()), p.out, 6));
  }
}

// Transposed and permuted operands whose rows or columns are unit-stride are handed to the
// GEMM as they are: the only allocation is the output.
TEST(Matmul, StridedViewsAreReadWithoutCopies) {
  Generator g(11);
  Tensor x = random({48, 80}, kFloat32, g), w = random({64, 80}, kFloat32, g);
  Tensor q = random({2, 24, 3, 16}, kFloat32, g), kt = random({2, 24, 3, 16}, kFloat32, g);
  Tensor qp = q.permute({0, 2, 1, 3}), kp = kt.permute({0, 2, 3, 1});  // (B, H, T, D), (B, H, D, T)
  Tensor bt = random({5, 33, 7}, kFloat64, g).transpose(1, 2);         // (5, 7, 33) column-major
  Tensor ab = random({5, 33, 9}, kFloat64, g);
  struct V { Tensor a, b; };
  for (const V& v : {V{x, w.t()}, V{w.t().t(), x.t()}, V{qp, kp}, V{bt, ab}, V{x.t().t(), w.t().slice(1, 0, 64, 1)}}) {
    Ref want = reference(values(v.a), v.a.shape(), values(v.b), v.b.shape());
    MemoryStats before = cpu_allocator().stats();
    Tensor c = matmul(v.a, v.b);
    EXPECT_EQ(cpu_allocator().stats().num_allocs, before.num_allocs + 1) << fmt::format("{} x {}", v.a.shape(), v.b.shape());
    EXPECT_TRUE(matches(c, want, c.dtype(), v.a.size(-1)));
  }
  // a column slice with step 2 is irregular: copied, still correct
  Tensor every_other = random({40, 66}, kFloat32, g).slice(1, 0, 66, 2);
  Tensor y = random({33, 5}, kFloat32, g);
  EXPECT_TRUE(matches(matmul(every_other, y), reference(values(every_other), {40, 33}, values(y), {33, 5}), kFloat32, 33));
  // an irregular operand broadcast over the batch is copied once, not once per batch
  Tensor shared = random({1, 7, 66}, kFloat32, g).slice(2, 0, 66, 2).expand({4, 7, 33});
  Tensor ys = random({4, 33, 5}, kFloat32, g);
  MemoryStats before = cpu_allocator().stats();
  Tensor c = matmul(shared, ys);
  MemoryStats after = cpu_allocator().stats();
  EXPECT_EQ(after.num_allocs, before.num_allocs + 2);  // the output and one (7, 33) copy
  EXPECT_TRUE(matches(c, reference(values(shared), {4, 7, 33}, values(ys), {4, 33, 5}), kFloat32, 33));
}

TEST(Matmul, ConcurrentCallsAgree) {
  Generator g(13);
  Tensor a = random({96, 80}, kFloat32, g), b = random({80, 72}, kFloat32, g);
  Ref want = reference(values(a), a.shape(), values(b), b.shape());
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) ok[t] += matches(matmul(a, b.t().contiguous().t()), want, kFloat32, 80) ? 1 : 0;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(4, 20));
}

TEST(Matmul, BadInput) {
  EXPECT_THROW(matmul(ones({2, 3}), ones({4, 5})), Error);
  EXPECT_THROW(matmul(ones({3}), ones({4})), Error);
  EXPECT_THROW(matmul(ones({2, 3, 4}), ones({3, 4, 5})), Error);  // batch 2 vs 3
  EXPECT_THROW(matmul(scalar_tensor(1.0), ones({2})), Error);
  EXPECT_THROW(matmul(ones({2}), scalar_tensor(1.0)), Error);
  EXPECT_THROW(matmul(ones({2, 2}, kBool), ones({2, 2}, kBool)), Error);
  EXPECT_THROW(matmul(Tensor(), ones({2})), Error);
  EXPECT_THROW(mm(ones({2, 3, 4}), ones({4, 5})), Error);
  EXPECT_THROW(mm(ones({3}), ones({3, 5})), Error);
  EXPECT_THROW(bmm(ones({2, 3, 4}), ones({3, 4, 5})), Error);
  EXPECT_THROW(bmm(ones({3, 4}), ones({4, 5})), Error);
  EXPECT_THROW(bmm(ones({2, 3, 4}), ones({2, 5, 4})), Error);
  try {
    matmul(ones({2, 3}), ones({4, 5}));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[matmul]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  }
}
