// Layers against float64 references computed here with plain loops, finite-difference
// gradient checks in float64, and bad input.
#include <cmath>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::Layout;
using strata::testing::leaf;
using strata::testing::Mat;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

// ---- Linear ------------------------------------------------------------------------------------

TEST(Linear, ForwardMatchesReferenceInEveryLayout) {
  Generator g(1);
  nn::Linear fc(5, 3, {.generator = &g});
  fc.to(kFloat64);
  Mat w(fc.weight);
  std::vector<double> b = values(fc.bias);
  for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
    SCOPED_TRACE(strata::testing::layout_name(l));
    Tensor x = strata::testing::with_layout(randn({4, 5}, kFloat64, &g), l);
    Mat ref = matmul_nt(Mat(x), w);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t o = 0; o < 3; ++o) ref(i, o) += b[o];
    EXPECT_TRUE(all_close(fc(x), ref.v, 1e-12, 1e-12));
  }
}

TEST(Linear, BatchedOneDimAndNoBias) {
  Generator g(2);
  nn::Linear fc(4, 2, {.bias = false, .generator = &g});
  EXPECT_FALSE(fc.bias.defined());
  EXPECT_EQ(fc.named_parameters().size(), 1u);
  fc.to(kFloat64);
  Mat w(fc.weight);
  Tensor x = randn({2, 3, 4}, kFloat64, &g);
  Tensor y = fc(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  EXPECT_TRUE(all_close(y, matmul_nt(Mat(x.reshape({6, 4})), w).v, 1e-12, 1e-12));
  // leading dims that do not merge into one (a transposed batch) take the batched path
  Tensor xt = x.transpose(0, 1);
  EXPECT_TRUE(all_close(fc(xt), matmul_nt(Mat(xt.contiguous().reshape({6, 4})), w).v, 1e-12, 1e-12));
  Tensor v = randn({4}, kFloat64, &g);
  EXPECT_EQ(fc(v).shape(), (Shape{2}));
  EXPECT_TRUE(all_close(fc(v), matmul_nt(Mat(v.view({1, 4})), w).v, 1e-12, 1e-12));
  EXPECT_EQ(fc(zeros({0, 4}, kFloat64)).shape(), (Shape{0, 2}));
}

TEST(Linear, DefaultInitBoundsFollowPyTorch) {
  nn::Linear fc(100, 50);
  const double bound = 1.0 / std::sqrt(100.0);
  double mx = 0;
  for (double v : values(fc.weight)) mx = std::max(mx, std::fabs(v));
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.9 * bound);
  for (double v : values(fc.bias)) EXPECT_LE(std::fabs(v), bound);
}

TEST(Linear, GradCheck) {
  Generator g(3);
  nn::Linear fc(4, 3, {.generator = &g});
  fc.to(kFloat64);
  Tensor x = leaf(randn({2, 3, 4}, kFloat64, &g));
  EXPECT_TRUE(gradcheck([&](V in) { return fc(in[0]); }, {x, fc.weight, fc.bias}));
  Tensor xs = leaf(randn({5, 4}, kFloat64, &g), Layout::Sliced);
  EXPECT_TRUE(gradcheck([&](V in) { return fc(in[0]); }, {xs, fc.weight, fc.bias}));
}

TEST(Linear, WrongInputNamesTheLayerAndShapes) {
  nn::Linear fc(3, 4);
  EXPECT_TRUE(throws_with([&] { fc(zeros({2, 5})); }, {"Linear", "in_features=3", "[2, 5]"}));
  EXPECT_TRUE(throws_with([&] { fc(zeros({})); }, {"Linear"}));
  EXPECT_TRUE(throws_with([&] { F::linear(zeros({2, 5}), zeros({4, 3})); }, {"[linear]", "[2, 5]", "[4, 3]"}));
  EXPECT_THROW(F::linear(zeros({2, 3}), zeros({4, 3}), zeros({3})), Error);
  EXPECT_THROW(F::linear(zeros({2, 3}), zeros({12})), Error);
}

// ---- Embedding ---------------------------------------------------------------------------------

TEST(Embedding, ForwardPicksRowsAndPaddingGetsNoGradient) {
  Generator g(4);
  nn::Embedding emb(6, 3, {.padding_idx = -1, .generator = &g});
  EXPECT_EQ(*emb.padding_idx, 5);
  for (double v : values(emb.weight.select(0, 5))) EXPECT_EQ(v, 0.0);
  emb.to(kFloat64);
  Mat w(emb.weight);
  Tensor idx = from_vector<int64_t>({1, 5, 1, 0, 3, 5}, Shape{2, 3});
  Tensor y = emb(idx);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
  std::vector<double> ref;
  for (int64_t i : {1, 5, 1, 0, 3, 5})
    for (int64_t d = 0; d < 3; ++d) ref.push_back(w(i, d));
  EXPECT_TRUE(all_close(y, ref, 0, 0));
  // gradient: repeated indices accumulate, the padding row stays zero
  Tensor up = randn({2, 3, 3}, kFloat64, &g);
  (y * up).sum().backward();
  Mat gu(up.reshape({6, 3}));
  Mat want(6, 3);
  const int64_t ids[] = {1, 5, 1, 0, 3, 5};
  for (int r = 0; r < 6; ++r)
    for (int d = 0; d < 3; ++d)
      if (ids[r] != 5) want(ids[r], d) += gu(r, d);
  EXPECT_TRUE(all_close(emb.weight.grad(), want.v, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(emb(idx.to(kInt32)), ref, 0, 0));
}

TEST(Embedding, GradCheckAndBadIndices) {
  Generator g(5);
  Tensor w = leaf(randn({5, 2}, kFloat64, &g));
  Tensor idx = from_vector<int64_t>({4, 0, 4, 2});
  EXPECT_TRUE(gradcheck([&](V in) { return F::embedding(idx, in[0]); }, {w}));
  EXPECT_TRUE(gradgradcheck([&](V in) { return square(F::embedding(idx, in[0])); }, {w}));
  EXPECT_TRUE(throws_with([&] { F::embedding(from_vector<int64_t>({1, 7}), w); }, {"[embedding]", "7", "5"}));
  EXPECT_TRUE(throws_with([&] { F::embedding(from_vector<int64_t>({-1}), w); }, {"[embedding]", "-1"}));
  EXPECT_THROW(F::embedding(from_vector<double>({1.0}), w), Error);
  EXPECT_THROW(F::embedding(idx, w, 5), Error);
  EXPECT_THROW(nn::Embedding(3, 2, {.padding_idx = 3}), Error);
  EXPECT_EQ(F::embedding(zeros({0}, kInt64), w).shape(), (Shape{0, 2}));
}

// ---- Dropout -----------------------------------------------------------------------------------

// Sizes with whole blocks of four and with a partial last block (the kernel runs them apart).
TEST(Dropout, MaskMatchesThePhiloxDrawAndScales) {
  for (const Shape& shape : {Shape{1000, 7}, Shape{1001, 7}, Shape{3}, Shape{5}})
    for (DType t : {kFloat64, kFloat32}) {
      Tensor x = randn(shape, t);
      Generator g1(77), g2(77);
      Tensor y = F::dropout(x, 0.3, true, &g1);
      Tensor u = rand(shape, kFloat32, &g2);  // the same counters: element i keeps when u_i >= p
      std::vector<double> xv = values(x), yv = values(y), uv = values(u);
      int64_t kept = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        const bool keep = static_cast<float>(uv[i]) >= 0.3f;
        kept += keep;
        const double want = keep ? (t == kFloat32 ? double(float(xv[i]) * float(1 / 0.7)) : xv[i] / 0.7) : 0.0;
        ASSERT_NEAR(yv[i], want, t == kFloat32 ? 1e-6 * std::fabs(want) : 1e-12) << i << " of " << fmt::format("{}", shape);
      }
      if (xv.size() > 1000) EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(xv.size()), 0.7, 0.02);
      EXPECT_EQ(g1.offset(), g2.offset());
    }
}

TEST(Dropout, EvalIdentityEdgesAndGradient) {
  Tensor x = leaf(randn({40, 5}, kFloat64));
  nn::Dropout drop(0.5);
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  drop.train();
  EXPECT_TRUE(F::dropout(x, 0.0).is_same(x));
  for (double v : values(F::dropout(x, 1.0))) EXPECT_EQ(v, 0.0);
  Generator g(9);
  Tensor y = F::dropout(x, 0.5, true, &g);
  y.backward(ones_like(y));
  std::vector<double> gy = values(x.grad()), yv = values(y);
  for (size_t i = 0; i < gy.size(); ++i) EXPECT_EQ(gy[i], yv[i] == 0 ? 0.0 : 2.0);
  // the mask is fixed by the generator state, so finite differences see the same mask
  EXPECT_TRUE(gradcheck([&](V in) {
    Generator same(11);
    return F::dropout(in[0], 0.4, true, &same);
  }, {x}));
  EXPECT_THROW(F::dropout(x, 1.5), Error);
  EXPECT_THROW(F::dropout(x, -0.1), Error);
  EXPECT_THROW(nn::Dropout(2.0), Error);
  EXPECT_EQ(F::dropout(zeros({0, 3}), 0.5).shape(), (Shape{0, 3}));
  Tensor h = randn({64}).to(kBFloat16);
  std::vector<double> hv = values(h), dv = values(F::dropout(h, 0.5));
  for (size_t i = 0; i < hv.size(); ++i) EXPECT_TRUE(dv[i] == 0 || dv[i] == hv[i] * 2);
}

TEST(Dropout, StatisticsPreserveTheMeanAndMasksAreIndependent) {
  Generator g(13);
  const int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    std::vector<double> y = values(F::dropout(ones({n}), p, true, &g));
    double sum = 0, sq = 0, both = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(y[i] == 0 || std::fabs(y[i] - 1 / (1 - p)) < 1e-6) << y[i];
      sum += y[i];
      sq += y[i] * y[i];
      if (i + 1 < y.size()) both += (y[i] != 0) && (y[i + 1] != 0);
    }
    const double mean = sum / n, var = sq / n - mean * mean, want_var = p / (1 - p);
    // E[y] = x and Var[y] = x^2 p / (1 - p); 5 standard errors
    EXPECT_NEAR(mean, 1.0, 5 * std::sqrt(want_var / n));
    EXPECT_NEAR(var, want_var, 0.05 * want_var);
    // neighbours are kept independently: P(both) = (1 - p)^2
    const double q = (1 - p) * (1 - p);
    EXPECT_NEAR(both / (n - 1), q, 5 * std::sqrt(q * (1 - q) / n));
  }
  // successive calls draw fresh masks; a fresh generator with the same seed repeats them
  Generator a(21), b(21);
  nn::Dropout d1(0.5, &a), d2(0.5, &b);
  Tensor x = ones({1000});
  Tensor first = d1(x);
  EXPECT_FALSE(equal(first, d1(x)));
  EXPECT_TRUE(equal(first, d2(x)));
}

// ---- normalization -----------------------------------------------------------------------------

namespace {
// Row-wise (layer / rms) normalization of a (rows, n) matrix with optional affine, in float64.
std::vector<double> norm_ref(const std::vector<double>& x, int64_t rows, int64_t n, const std::vector<double>& w,
                             const std::vector<double>& b, double eps, bool rms) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * n;
    double m = 0, v = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; ++j) m += xr[j];
      m /= static_cast<double>(n);
    }
    for (int64_t j = 0; j < n; ++j) v += (xr[j] - m) * (xr[j] - m);
    v /= static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) {
      double h = (xr[j] - m) / std::sqrt(v + eps);
      y[r * n + j] = h * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
    }
  }
  return y;
}

// The layer norm composed of reductions, the reference the dedicated kernel is held to.
Tensor composed_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  Tensor xc = x - mean(x, {-1}, true);
  return xc * rsqrt(var(x, {-1}, 0, true) + eps) * w + b;
}
}  // namespace

TEST(LayerNorm, ForwardMatchesReference) {
  Generator g(6);
  for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
    SCOPED_TRACE(strata::testing::layout_name(l));
    nn::LayerNorm ln(Shape{3, 4}, {.eps = 1e-3});
    ln.to(kFloat64);
    ln.weight.set_data(randn({3, 4}, kFloat64, &g));
    ln.bias.set_data(randn({3, 4}, kFloat64, &g));
    Tensor x = strata::testing::with_layout(randn({5, 3, 4}, kFloat64, &g) * 3 + 1, l);
    EXPECT_TRUE(all_close(ln(x), norm_ref(values(x), 5, 12, values(ln.weight), values(ln.bias), 1e-3, false), 1e-12,
                          1e-12));
  }
  nn::LayerNorm plain(7, {.elementwise_affine = false});
  EXPECT_TRUE(plain.named_parameters().empty());
  Tensor x = randn({2, 7}, kFloat64, &g);
  EXPECT_TRUE(all_close(plain(x), norm_ref(values(x), 2, 7, {}, {}, 1e-5, false), 1e-12, 1e-12));
  nn::LayerNorm no_bias(7, {.bias = false});
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
}

TEST(LayerNorm, KernelMatchesComposedReferenceInFloat32) {
  Generator g(7);
  // enough rows for several blocks of the weight-gradient sum, and both thread counts
  Tensor x = (randn({70, 300}, kFloat32, &g) * 2 + 0.5).requires_grad_();
  Tensor w = randn({300}, kFloat32, &g).requires_grad_(), b = randn({300}, kFloat32, &g).requires_grad_();
  Tensor up = randn({70, 300}, kFloat32, &g);
  Tensor y = F::layer_norm(x, {300}, w, b);
  Tensor yc = composed_layer_norm(x, w, b, 1e-5);
  EXPECT_TRUE(all_close(y, values(yc), 1e-4, 1e-4));
  auto gk = autograd::grad({y}, {x, w, b}, {up});
  auto gc = autograd::grad({yc}, {x, w, b}, {up});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(gk[i], values(gc[i]), 1e-3, 1e-3)) << i;
  const int threads = get_num_threads();
  set_num_threads(1);
  auto g1 = autograd::grad({F::layer_norm(x, {300}, w, b)}, {x, w, b}, {up});
  set_num_threads(2);
  auto g2 = autograd::grad({F::layer_norm(x, {300}, w, b)}, {x, w, b}, {up});
  set_num_threads(threads);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(values(g1[i]), values(g2[i])) << i;
  // bfloat16 keeps float statistics
  Tensor xb = x.detach().to(kBFloat16);
  EXPECT_TRUE(all_close(F::layer_norm(xb, {300}), norm_ref(values(xb), 70, 300, {}, {}, 1e-5, false), 2e-2, 2e-2));
}

TEST(LayerNorm, GradCheckIncludingSecondOrder) {
  Generator g(8);
  Tensor x = leaf(randn({3, 2, 5}, kFloat64, &g), Layout::Transposed);
  Tensor w = leaf(randn({2, 5}, kFloat64, &g)), b = leaf(randn({2, 5}, kFloat64, &g));
  auto f = [](V in) { return F::layer_norm(in[0], {2, 5}, in[1], in[2]); };
  EXPECT_TRUE(gradcheck(f, {x, w, b}));
  EXPECT_TRUE(gradgradcheck(f, {x, w, b}));
  EXPECT_TRUE(gradcheck([](V in) { return F::layer_norm(in[0], {5}); }, {x}));
}

TEST(RMSNorm, ForwardAndGradCheck) {
  Generator g(9);
  nn::RMSNorm rms(6, {.eps = 1e-4});
  rms.to(kFloat64);
  rms.weight.set_data(randn({6}, kFloat64, &g));
  Tensor x = randn({4, 6}, kFloat64, &g);
  EXPECT_TRUE(all_close(rms(x), norm_ref(values(x), 4, 6, values(rms.weight), {}, 1e-4, true), 1e-12, 1e-12));
  Tensor xl = leaf(x);
  auto f = [&](V in) { return rms(in[0]); };
  EXPECT_TRUE(gradcheck(f, {xl, rms.weight}));
  EXPECT_TRUE(gradgradcheck(f, {xl, rms.weight}));
  // default eps: the compute type's machine epsilon, float's for the 16-bit types too (on
  // inputs of mean square 1e-4, bfloat16's own 2^-7 would shrink the output 40 times)
  nn::RMSNorm d(6);
  Tensor xf = randn({2, 6}, kFloat32, &g);
  EXPECT_TRUE(all_close(d(xf), norm_ref(values(xf), 2, 6, {}, {}, 1.1920929e-07, true), 1e-5, 1e-6));
  for (DType t : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor small = (randn({2, 6}, kFloat32, &g) * 0.01).to(t);
    EXPECT_TRUE(all_close(F::rms_norm(small, {6}), norm_ref(values(small), 2, 6, {}, {}, 1.1920929e-07, true),
                          1e-2, 1e-2));
  }
  EXPECT_TRUE(all_close(F::rms_norm(x, {6}), norm_ref(values(x), 4, 6, {}, {}, 2.220446049250313e-16, true), 1e-12,
                        1e-12));
}

TEST(GroupNorm, ForwardAndGradCheck) {
  Generator g(10);
  nn::GroupNorm gn(2, 4);
  gn.to(kFloat64);
  gn.weight.set_data(randn({4}, kFloat64, &g));
  gn.bias.set_data(randn({4}, kFloat64, &g));
  Tensor x = randn({3, 4, 2, 3}, kFloat64, &g);
  // groups of 2 channels x 6 positions are 12 contiguous values per (sample, group)
  std::vector<double> ref = norm_ref(values(x), 6, 12, {}, {}, 1e-5, false);
  std::vector<double> w = values(gn.weight), b = values(gn.bias);
  for (size_t i = 0; i < ref.size(); ++i) {
    int64_t c = static_cast<int64_t>(i / 6) % 4;
    ref[i] = ref[i] * w[c] + b[c];
  }
  EXPECT_TRUE(all_close(gn(x), ref, 1e-12, 1e-12));
  Tensor xl = leaf(x, Layout::Sliced);
  EXPECT_TRUE(gradcheck([&](V in) { return gn(in[0]); }, {xl, gn.weight, gn.bias}));
  EXPECT_THROW(nn::GroupNorm(3, 4), Error);
  EXPECT_TRUE(throws_with([&] { gn(zeros({2, 3, 4}, kFloat64)); }, {"GroupNorm", "[2, 3, 4]"}));
  EXPECT_THROW(F::group_norm(zeros({2, 4}), 3), Error);
}

TEST(Normalization, BadInputs) {
  nn::LayerNorm ln(4);
  EXPECT_TRUE(throws_with([&] { ln(zeros({2, 5})); }, {"LayerNorm", "[2, 5]"}));
  EXPECT_TRUE(throws_with([&] { F::layer_norm(zeros({2, 4}), {4}, zeros({5})); }, {"[layer_norm]", "weight"}));
  EXPECT_THROW(F::layer_norm(zeros({2, 4}, kInt64), {4}), Error);
  EXPECT_THROW(F::layer_norm(zeros({2, 4}), {}), Error);
  EXPECT_THROW(F::layer_norm(zeros({4}), {2, 4}), Error);
  EXPECT_EQ(ln(zeros({0, 4})).shape(), (Shape{0, 4}));
  EXPECT_TRUE(throws_with([] { nn::LayerNorm(-1); }, {"[LayerNorm]", "negative"}));
  EXPECT_TRUE(throws_with([] { nn::RMSNorm(Shape{2, -3}); }, {"[RMSNorm]", "negative"}));
}

// ---- activations and shape layers --------------------------------------------------------------

TEST(Activations, ModulesMatchReferencesAndGradCheck) {
  struct Case {
    const char* name;
    std::shared_ptr<nn::Module> m;
    std::function<double(double)> ref;
  };
  const double k = std::sqrt(2.0 / M_PI);
  const std::vector<Case> cases = {
      {"ReLU", std::make_shared<nn::ReLU>(), [](double x) { return x > 0 ? x : 0; }},
      {"GELU", std::make_shared<nn::GELU>(), [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"GELU_tanh", std::make_shared<nn::GELU>("tanh"),
       [k](double x) { return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x))); }},
      {"SiLU", std::make_shared<nn::SiLU>(), [](double x) { return x / (1 + std::exp(-x)); }},
      {"Tanh", std::make_shared<nn::Tanh>(), [](double x) { return std::tanh(x); }},
      {"Sigmoid", std::make_shared<nn::Sigmoid>(), [](double x) { return 1 / (1 + std::exp(-x)); }},
      {"LeakyReLU", std::make_shared<nn::LeakyReLU>(0.2), [](double x) { return x > 0 ? x : 0.2 * x; }},
  };
  Generator g(12);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = leaf(randn({3, 4}, kFloat64, &g) * 2, Layout::Transposed);
    std::vector<double> xv = values(x), want;
    for (double v : xv) want.push_back(c.ref(v));
    EXPECT_TRUE(all_close((*c.m)(x), want, 1e-12, 1e-12));
    EXPECT_TRUE(gradcheck([&](V in) { return (*c.m)(in[0]); }, {x}));
  }
  EXPECT_THROW(nn::GELU("fast"), Error);
  nn::Softmax sm(0);
  Tensor x = randn({3, 2}, kFloat64, &g);
  Mat xm(x);
  std::vector<double> want(6);
  for (int64_t j = 0; j < 2; ++j) {
    double s = 0;
    for (int64_t i = 0; i < 3; ++i) s += std::exp(xm(i, j));
    for (int64_t i = 0; i < 3; ++i) want[i * 2 + j] = std::exp(xm(i, j)) / s;
  }
  EXPECT_TRUE(all_close(sm(x), want, 1e-12, 1e-12));
  Tensor xl = leaf(x);
  EXPECT_TRUE(gradcheck([&](V in) { return nn::LogSoftmax(1)(in[0]); }, {xl}));
}

TEST(ShapeLayers, FlattenAndIdentity) {
  Tensor x = randn({2, 3, 4, 5});
  nn::Flatten flat;
  EXPECT_EQ(flat(x).shape(), (Shape{2, 60}));
  EXPECT_EQ(nn::Flatten(0, 2)(x).shape(), (Shape{24, 5}));
  EXPECT_EQ(flat(x).storage(), x.storage());  // a view
  EXPECT_TRUE(nn::Identity()(x).is_same(x));
  EXPECT_EQ(values(flat(x)), values(x));
}
