// The fused cross entropy (Note [Fused cross entropy] in src/nn/loss.cpp): 2-D logits with
// class indices run the cross_entropy_fused kernels, checked here against the composed path
// (the same logits seen as (N, C, 1), which takes the composed ops) and a float64
// reference, over row lengths that exercise the lane tails, weights, label smoothing,
// ignore_index and every reduction, with finite-difference gradient checks in float64,
// low-precision dtypes, extreme logits, and which path each input takes.
#include <cmath>
#include <limits>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// Per-row losses of logits (n, c) in float64 (0 for ignored rows), as the definition reads.
std::vector<double> rows_ref(const std::vector<double>& x, int64_t n, int64_t c, const std::vector<int64_t>& target,
                             const std::vector<double>& weight, int64_t ignore, double eps) {
  std::vector<double> per;
  for (int64_t i = 0; i < n; ++i) {
    const double* r = x.data() + i * c;
    double mx = -kInf, z = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, r[j]);
    for (int64_t j = 0; j < c; ++j) z += std::exp(r[j] - mx);
    const double lse = mx + std::log(z);
    const int64_t t = target[static_cast<size_t>(i)];
    if (t == ignore) {
      per.push_back(0);
      continue;
    }
    auto w = [&](int64_t j) { return weight.empty() ? 1.0 : weight[static_cast<size_t>(j)]; };
    double smooth = 0;
    for (int64_t j = 0; j < c; ++j) smooth += w(j) * (lse - r[j]);
    per.push_back((1 - eps) * w(t) * (lse - r[t]) + (eps > 0 ? eps / static_cast<double>(c) * smooth : 0));
  }
  return per;
}

double reduced(const std::vector<double>& per, const std::vector<int64_t>& target, const std::vector<double>& weight,
               int64_t ignore, const std::string& red) {
  double s = 0, wsum = 0;
  for (size_t i = 0; i < per.size(); ++i) {
    s += per[i];
    if (target[i] != ignore) wsum += weight.empty() ? 1.0 : weight[static_cast<size_t>(target[i])];
  }
  return red == "sum" ? s : s / wsum;
}

// The same loss through the composed path: (N, C, 1) logits and (N, 1) targets.
Tensor composed(const Tensor& x, const Tensor& t, const F::CrossEntropyOptions& o) {
  Tensor l = F::cross_entropy(x.unsqueeze(2), t.unsqueeze(1), o);
  return o.reduction == "none" ? l.squeeze(1) : l;
}

// Counts the fused kernels run through run_kernel.
struct FusedCounter : OpObserver {
  int forward = 0, backward = 0;
  void on_begin(OpId op, const KernelCall&) override {
    forward += op == OpId::cross_entropy_fused;
    backward += op == OpId::cross_entropy_fused_backward;
  }
  void on_end(OpId, const KernelCall&) override {}
};

struct Case {
  std::vector<int64_t> target;
  std::vector<double> weight;
};

// Targets cycling over the classes, every fifth row ignored.
Case make_case(int64_t n, int64_t c, bool weighted, Generator& g) {
  Case k;
  for (int64_t i = 0; i < n; ++i) k.target.push_back(i % 5 == 2 ? -100 : (i * 7 + 3) % c);
  if (weighted) k.weight = values(rand({c}, kFloat64, &g) + 0.5);
  return k;
}

}  // namespace

TEST(CrossEntropyFused, MatchesComposedAndReferenceInFloat64) {
  Generator g(11);
  for (int64_t c : {1, 7, 33, 257, 1023, 4097}) {
    const int64_t n = c > 1000 ? 6 : 13;
    Tensor x = randn({n, c}, kFloat64, &g) * 3;
    for (bool weighted : {false, true}) {
      const Case k = make_case(n, c, weighted, g);
      Tensor t = from_vector<int64_t>(k.target, Shape{n});
      for (double eps : {0.0, 0.15})
        for (std::string red : {"none", "sum", "mean"}) {
          SCOPED_TRACE(fmt::format("c={} weighted={} eps={} {}", c, weighted, eps, red));
          F::CrossEntropyOptions o{weighted ? from_vector(k.weight) : Tensor(), -100, red, eps};
          Tensor xf = x.detach().requires_grad_(), xc = x.detach().requires_grad_();
          FusedCounter count;
          set_op_observer(&count);
          Tensor lf = F::cross_entropy(xf, t, o);
          Tensor up = red == "none" ? randn({n}, kFloat64, &g) : full({}, 0.7, kFloat64);
          lf.backward(up);
          set_op_observer(nullptr);
          EXPECT_EQ(count.forward, 1);
          EXPECT_EQ(count.backward, 1);
          Tensor lc = composed(xc, t, o);
          lc.backward(up);
          const auto per = rows_ref(values(x), n, c, k.target, k.weight, -100, eps);
          if (red == "none") EXPECT_TRUE(all_close(lf, per, 1e-12, 1e-12));
          else EXPECT_TRUE(all_close(lf, {reduced(per, k.target, k.weight, -100, red)}, 1e-12, 1e-12));
          EXPECT_TRUE(all_close(lf, values(lc), 1e-12, 1e-12));
          EXPECT_TRUE(all_close(xf.grad(), values(xc.grad()), 1e-12, 1e-12));
        }
    }
  }
}

TEST(CrossEntropyFused, GradCheck) {
  Generator g(12);
  const std::vector<double> weight = {0.5, 2.0, 1.0, 0.25, 1.5};
  Tensor x = randn({6, 5}, kFloat64, &g);
  Tensor t = from_vector<int64_t>({0, 4, -100, 2, 1, 3}, Shape{6});
  for (bool weighted : {false, true})
    for (double eps : {0.0, 0.3})
      for (std::string red : {"none", "sum", "mean"}) {
        SCOPED_TRACE(fmt::format("weighted={} eps={} {}", weighted, eps, red));
        F::CrossEntropyOptions o{weighted ? from_vector(weight) : Tensor(), -100, red, eps};
        Tensor xl = leaf(x);
        EXPECT_TRUE(gradcheck([&](V in) { return F::cross_entropy(in[0], t, o); }, {xl}));
        // non-contiguous logits
        Tensor xt = leaf(x, strata::testing::Layout::Transposed);
        EXPECT_TRUE(gradcheck([&](V in) { return F::cross_entropy(in[0], t, o); }, {xt}));
      }
}

TEST(CrossEntropyFused, LowPrecisionAgainstFloat64) {
  Generator g(13);
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    for (int64_t c : {7, 257, 4097}) {
      const int64_t n = 9;
      SCOPED_TRACE(fmt::format("{} c={}", dt, c));
      Tensor x64 = randn({n, c}, kFloat64, &g) * 2;
      Tensor x = x64.to(dt);  // the reference sees the rounded logits
      const Case k = make_case(n, c, false, g);
      Tensor t = from_vector<int64_t>(k.target, Shape{n});
      F::CrossEntropyOptions o{Tensor(), -100, "none", 0.1};
      Tensor xl = x.detach().requires_grad_();
      Tensor loss = F::cross_entropy(xl, t, o);
      EXPECT_EQ(loss.dtype(), dt);
      const double tol = dt == kFloat32 ? 1e-5 : dt == kFloat16 ? 2e-3 : 1.6e-2;
      EXPECT_TRUE(all_close(loss, rows_ref(values(x), n, c, k.target, {}, -100, 0.1), tol, tol));
      loss.sum().backward();
      Tensor xr = x.to(kFloat64).requires_grad_();
      F::cross_entropy(xr, t, o).sum().backward();
      EXPECT_TRUE(all_close(xl.grad(), values(xr.grad()), tol, tol * 1e-2));
    }
  }
}

TEST(CrossEntropyFused, ExtremeLogits) {
  // huge logits stay finite; a -inf logit (a masked class) is fine unless it is the target
  // or smoothing spreads mass onto it
  Tensor big = from_vector<double>({1000, -1000, 0, 999}, Shape{1, 4});
  EXPECT_NEAR(F::cross_entropy(big, from_vector<int64_t>({3}, Shape{1})).item<double>(),
              1.0 + std::log(1 + std::exp(-1.0)), 1e-12);
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor masked = from_vector<double>({-kInf, 1, 2, -kInf, 0.5, 3}, Shape{2, 3}).to(dt);
    Tensor t = from_vector<int64_t>({2, 1}, Shape{2});
    Tensor xl = masked.detach().requires_grad_();
    Tensor loss = F::cross_entropy(xl, t, {.reduction = "none"});
    const double l0 = std::log(std::exp(1.0) + std::exp(2.0)) - 2, l1 = std::log(std::exp(0.5) + std::exp(3.0)) - 0.5;
    EXPECT_TRUE(all_close(loss, {l0, l1}, 1e-6, 1e-6));
    loss.sum().backward();
    const std::vector<double> grad = values(xl.grad());
    EXPECT_EQ(grad[0], 0.0);
    EXPECT_EQ(grad[3], 0.0);
    for (double v : grad) EXPECT_TRUE(std::isfinite(v));
    EXPECT_TRUE(std::isinf(F::cross_entropy(masked, t, {.reduction = "none", .label_smoothing = 0.1})
                               .select(0, 0).item<double>()));
  }
  // every logit -inf: lse = -inf, and the loss -inf - -inf is NaN
  Tensor all_masked = full({1, 3}, -kInf, kFloat64);
  EXPECT_TRUE(std::isnan(F::cross_entropy(all_masked, from_vector<int64_t>({1}, Shape{1})).item<double>()));
  // NaN logits propagate
  Tensor with_nan = from_vector<double>({0, NAN, 1}, Shape{1, 3});
  EXPECT_TRUE(std::isnan(F::cross_entropy(with_nan, from_vector<int64_t>({0}, Shape{1})).item<double>()));
}

TEST(CrossEntropyFused, WhichPathRuns) {
  Generator g(14);
  auto runs_fused = [](const std::function<void()>& f) {
    FusedCounter count;
    set_op_observer(&count);
    f();
    set_op_observer(nullptr);
    return count.forward > 0;
  };
  Tensor x = randn({4, 5}, kFloat32, &g);
  Tensor t = from_vector<int64_t>({0, 1, 2, 3}, Shape{4});
  EXPECT_TRUE(runs_fused([&] { F::cross_entropy(x, t); }));
  EXPECT_TRUE(runs_fused([&] { F::cross_entropy(x, t.to(kInt32)); }));
  EXPECT_TRUE(runs_fused([&] { F::cross_entropy(x.select(0, 1), from_vector<int64_t>({2}).view({})); }));
  EXPECT_FALSE(runs_fused([&] { F::cross_entropy(x.unsqueeze(2), t.unsqueeze(1)); }));
  EXPECT_FALSE(runs_fused([&] { F::cross_entropy(x, softmax(x, 1)); }));
  // empty batches reduce as the composed path does, without running a kernel
  EXPECT_TRUE(std::isnan(F::cross_entropy(zeros({0, 5}), zeros({0}, kInt64)).item<double>()));
  EXPECT_EQ(F::cross_entropy(zeros({0, 5}), zeros({0}, kInt64), {.reduction = "sum"}).item<double>(), 0.0);
  EXPECT_EQ(F::cross_entropy(zeros({0, 5}), zeros({0}, kInt64), {.reduction = "none"}).shape(), Shape{0});
}
