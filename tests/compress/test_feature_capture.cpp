// FeatureCapture: a teacher's and a student's hidden features captured by forward hooks and
// distilled with feature_distillation_loss; the value against the float64 formula computed here
// from the parameters, the gradients against a loss built from the same features by hand.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

// relu(W x + b) for one row of x, W (out, in), in float64.
std::vector<double> relu_affine(const nn::Linear& lin, const std::vector<double>& x) {
  const std::vector<double> w = values(lin.weight), b = values(lin.bias);
  const size_t in = x.size(), out = b.size();
  std::vector<double> y(out);
  for (size_t o = 0; o < out; ++o) {
    double s = b[o];
    for (size_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = std::max(s, 0.0);
  }
  return y;
}

}  // namespace

TEST(FeatureCapture, DistillsHiddenFeaturesWithoutChangingTheModels) {
  Generator g(11);
  nn::Sequential teacher{nn::Linear(4, 6, {.generator = &g}), nn::ReLU(), nn::Linear(6, 3, {.generator = &g})};
  nn::Sequential student{nn::Linear(4, 5, {.generator = &g}), nn::ReLU(), nn::Linear(5, 3, {.generator = &g})};
  compress::FeatureAdapter adapter(5, 6, 1, {.generator = &g});
  for (nn::Module* m : std::vector<nn::Module*>{&teacher, &student, &adapter}) m->to(kFloat64);
  const Tensor x = randn({3, 4}, kFloat64, &g), y = from_vector<int64_t>({0, 2, 1});

  compress::Distiller kd(teacher, student);
  compress::FeatureCapture t_feat(teacher, "1"), s_feat(student, "1");
  EXPECT_TRUE(throws_with([&] { (void)s_feat.output(); }, {"FeatureCapture", "\"1\"", "has not run"}));
  const auto out = kd.forward(x, y);
  const Tensor feature_loss = compress::feature_distillation_loss(adapter(s_feat.output()), t_feat.output());
  EXPECT_FALSE(t_feat.output().requires_grad());  // the teacher ran under no_grad
  EXPECT_TRUE(s_feat.output().requires_grad());

  // mean over (3, 6) of (A relu(Ws x + bs) + c - relu(Wt x + bt))^2
  const std::vector<double> xv = values(x), a = values(adapter.proj.weight), c = values(adapter.proj.bias);
  const auto& t0 = dynamic_cast<const nn::Linear&>(teacher[0]);
  const auto& s0 = dynamic_cast<const nn::Linear&>(student[0]);
  double mse = 0;
  for (size_t n = 0; n < 3; ++n) {
    const std::vector<double> row(xv.begin() + static_cast<std::ptrdiff_t>(4 * n),
                                  xv.begin() + static_cast<std::ptrdiff_t>(4 * n + 4));
    const auto ht = relu_affine(t0, row), hs = relu_affine(s0, row);
    for (size_t o = 0; o < 6; ++o) {
      double v = c[o];
      for (size_t i = 0; i < 5; ++i) v += a[o * 5 + i] * hs[i];
      mse += (v - ht[o]) * (v - ht[o]);
    }
  }
  EXPECT_NEAR(feature_loss.item<double>(), mse / 18, 1e-12);

  // gradients: the same loss with the features computed by hand, without hooks
  (out.loss + feature_loss * 0.5).backward();
  std::vector<std::vector<double>> hooked;
  for (const Tensor& p : student.parameters()) hooked.push_back(values(p.grad()));
  for (const Tensor& p : teacher.parameters()) EXPECT_FALSE(p.grad().defined());
  student.zero_grad();
  Tensor teacher_hidden;
  {
    NoGradGuard no_grad;
    teacher_hidden = relu(teacher[0].forward(x));
  }
  const Tensor by_hand = compress::distillation_loss(student.forward(x), out.teacher_logits, {}, y) +
                         compress::feature_distillation_loss(adapter(relu(student[0].forward(x))), teacher_hidden) *
                             0.5;
  by_hand.backward();
  const auto params = student.parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(all_close(params[i].grad(), hooked[i], 1e-12, 1e-12)) << i;
}

TEST(FeatureCapture, KeepsTheLastOutputAndRemovesItsHookWhenDestroyed) {
  nn::Sequential model{nn::Linear(2, 3), nn::ReLU()};
  {
    compress::FeatureCapture capture(model, "0");
    EXPECT_TRUE(model[0].has_hooks());
    const Tensor x1 = randn({1, 2}), x2 = randn({4, 2});
    model(x1);
    model(x2);
    EXPECT_EQ(capture.output().shape(), (Shape{4, 3}));  // the last call's
    EXPECT_TRUE(all_close(capture.output(), values(model[0].forward(x2)), 0, 0));
    capture.clear();
    EXPECT_FALSE(capture.has_output());
    compress::FeatureCapture whole(model, "");  // "" is the model itself
    model(x1);
    EXPECT_EQ(whole.output().shape(), (Shape{1, 3}));
  }
  EXPECT_FALSE(model[0].has_hooks());
  EXPECT_FALSE(model.has_hooks());
  EXPECT_TRUE(throws_with([&] { compress::FeatureCapture bad(model, "2"); },
                          {"[FeatureCapture]", "Sequential has no submodule named \"2\""}));
}

TEST(FeatureCapture, CapturesAttentionInsideAnEncoderLayer) {
  // the layer calls self_attn(x, x, x, ...): the capture keeps the attention's output (norm_first,
  // so the attention reads norm1(x))
  Generator g(4);
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16, .dropout = 0, .norm_first = true, .generator = &g});
  layer.to(kFloat64);
  compress::FeatureCapture capture(layer, "self_attn");
  const Tensor x = randn({5, 3, 8}, kFloat64, &g);
  layer(x);
  const Tensor h = layer.norm1.forward(x);
  EXPECT_TRUE(all_close(capture.output(), values(layer.self_attn.forward(h, h, h)), 0, 0));
}
