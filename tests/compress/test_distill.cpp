// Distillation against float64 formulas written here (Hinton et al. 2015's loss, MSE and cosine
// feature losses, a 1x1 adapter), finite-difference gradients, the teacher's lack of gradient,
// and bad input.
#include <cmath>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
using V = const std::vector<Tensor>&;

namespace {

// log softmax of row `row` of a (N, C) matrix held flat, at temperature t, in float64.
std::vector<double> log_softmax_row(const std::vector<double>& x, int64_t c, int64_t row, double t) {
  double m = -INFINITY;
  for (int64_t j = 0; j < c; ++j) m = std::max(m, x[row * c + j] / t);
  double s = 0;
  for (int64_t j = 0; j < c; ++j) s += std::exp(x[row * c + j] / t - m);
  std::vector<double> out(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) out[j] = x[row * c + j] / t - m - std::log(s);
  return out;
}

// Hinton's loss per sample, and reduced as `reduction` says; target < 0: no hard term.
std::vector<double> reference(const Tensor& student, const Tensor& teacher, const std::vector<int64_t>& target,
                              double t, double alpha, const std::string& reduction) {
  const int64_t n = student.size(0), c = student.size(1);
  const std::vector<double> s = values(student), te = values(teacher);
  std::vector<double> per;
  double kl_sum = 0, ce_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto ls = log_softmax_row(s, c, i, t), lt = log_softmax_row(te, c, i, t);
    double kl = 0;
    for (int64_t j = 0; j < c; ++j) kl += std::exp(lt[j]) * (lt[j] - ls[j]);
    const double ce = target.empty() ? 0 : -log_softmax_row(s, c, i, 1)[target[i]];
    per.push_back(alpha * t * t * kl + (target.empty() ? 0 : (1 - alpha) * ce));
    kl_sum += kl;
    ce_sum += ce;
  }
  if (reduction == "none") return per;
  const double div = reduction == "batchmean" ? static_cast<double>(n) : 1.0;
  return {alpha * t * t * kl_sum / div + (target.empty() ? 0 : (1 - alpha) * ce_sum / div)};
}

}  // namespace

TEST(Distillation, LossMatchesFloat64Formula) {
  Generator g(1);
  const std::vector<int64_t> labels{2, 0, 4, 1};
  const Tensor target = from_vector(labels);
  for (DType dt : {kFloat64, kFloat32}) {
    const Tensor s = (randn({4, 5}, kFloat64, &g) * 3.0).to(dt), te = (randn({4, 5}, kFloat64, &g) * 3.0).to(dt);
    for (double t : {1.0, 2.0, 4.5})
      for (double alpha : {0.0, 0.3, 1.0})
        for (const char* r : {"batchmean", "sum", "none"})
          for (bool with_target : {false, true}) {
            SCOPED_TRACE(::testing::Message() << dt << " T=" << t << " alpha=" << alpha << " " << r << " target "
                                              << with_target);
            const Tensor got = compress::distillation_loss(s, te, {.temperature = t, .alpha = alpha, .reduction = r},
                                                           with_target ? target : Tensor());
            const auto want = reference(s, te, with_target ? labels : std::vector<int64_t>{}, t, alpha, r);
            EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
            EXPECT_TRUE(all_close(got, want, dt == kFloat64 ? 1e-12 : 1e-5, dt == kFloat64 ? 1e-12 : 1e-6));
          }
  }
}

TEST(Distillation, SpatialLogitsSumTheKLOverClassesOnly) {
  // (N, C, L): "none" gives (N, L), the per-position KL; batchmean divides the total by N
  Generator g(2);
  const Tensor s = randn({2, 3, 4}, kFloat64, &g), te = randn({2, 3, 4}, kFloat64, &g);
  const Tensor none = compress::distillation_loss(s, te, {.temperature = 2, .alpha = 1, .reduction = "none"});
  ASSERT_EQ(none.shape(), (Shape{2, 4}));
  const Tensor s2 = s.transpose(1, 2).reshape({8, 3}), te2 = te.transpose(1, 2).reshape({8, 3});
  EXPECT_TRUE(all_close(none, reference(s2, te2, {}, 2, 1, "none"), 1e-12, 1e-12));
  const Tensor bm = compress::distillation_loss(s, te, {.temperature = 2, .alpha = 1});
  EXPECT_NEAR(bm.item<double>(), reference(s2, te2, {}, 2, 1, "sum")[0] / 2, 1e-12);
}

TEST(Distillation, LargeLogitsStayFinite) {
  const Tensor s = from_vector<double>({3e4, -2e4, 0, 1e4, 5e4, -5e4}, Shape{2, 3}).to(kFloat32);
  const Tensor te = from_vector<double>({-1e4, 2e4, 0, 4e4, 5e4, 0}, Shape{2, 3}).to(kFloat32);
  const Tensor got = compress::distillation_loss(s, te, {.temperature = 2, .alpha = 0.5}, from_vector<int64_t>({0, 1}));
  ASSERT_TRUE(std::isfinite(got.item<double>()));
  EXPECT_NEAR(got.item<double>(), reference(s, te, {0, 1}, 2, 0.5, "batchmean")[0], 1.0);
}

TEST(Distillation, GradientMatchesFiniteDifferences) {
  Generator g(3);
  const Tensor te = randn({3, 4}, kFloat64, &g), target = from_vector<int64_t>({1, 3, 0});
  for (const char* r : {"batchmean", "sum", "none"}) {
    SCOPED_TRACE(r);
    const compress::DistillationOptions o{.temperature = 3, .alpha = 0.7, .reduction = r};
    EXPECT_TRUE(gradcheck([&](V in) { return compress::distillation_loss(in[0], te, o, target); },
                          {leaf(randn({3, 4}, kFloat64, &g))}));
  }
  // probability targets and label smoothing pass through to cross_entropy
  compress::DistillationOptions o{.temperature = 2, .alpha = 0.4};
  o.cross_entropy.label_smoothing = 0.1;
  const Tensor soft = softmax(randn({3, 4}, kFloat64, &g), 1);
  EXPECT_TRUE(gradcheck([&](V in) { return compress::distillation_loss(in[0], te, o, soft); },
                        {leaf(randn({3, 4}, kFloat64, &g))}));
}

TEST(Distillation, TeacherGetsNoGradient) {
  Generator g(4);
  const Tensor s = leaf(randn({2, 3}, kFloat64, &g)), te = leaf(randn({2, 3}, kFloat64, &g));
  compress::distillation_loss(s, te, {.temperature = 2, .alpha = 0.5}, from_vector<int64_t>({0, 2})).backward();
  EXPECT_TRUE(s.grad().defined());
  EXPECT_FALSE(te.grad().defined());
}

TEST(Distillation, DistillerRunsTheTeacherInEvalWithoutGrad) {
  Generator g(5);
  nn::Sequential teacher(nn::Linear(6, 8, {.generator = &g}), nn::Dropout(0.5), nn::Linear(8, 4, {.generator = &g}));
  nn::Linear student(6, 4, {.generator = &g});
  compress::Distiller kd(teacher, student, {.temperature = 3, .alpha = 0.8});
  teacher.train();  // the distiller puts it back in eval mode
  const Tensor x = randn({5, 6}, kFloat32, &g), y = from_vector<int64_t>({0, 1, 2, 3, 0});
  const auto out = kd.forward(x, y);
  EXPECT_FALSE(teacher.is_training());
  EXPECT_FALSE(out.teacher_logits.requires_grad());
  Tensor want_teacher;
  {
    NoGradGuard no_grad;
    want_teacher = teacher(x);  // eval: dropout is the identity, so the same logits twice
  }
  EXPECT_TRUE(all_close(out.teacher_logits, values(want_teacher), 0, 0));
  const auto want = reference(student(x), want_teacher, {0, 1, 2, 3, 0}, 3, 0.8, "batchmean");
  EXPECT_TRUE(all_close(out.loss, want, 1e-5, 1e-6));
  out.loss.backward();
  EXPECT_TRUE(student.weight.grad().defined());
  for (const Tensor& p : teacher.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Distillation, FeatureLossesMatchFormulas) {
  Generator g(6);
  const Tensor s = randn({2, 3, 2, 2}, kFloat64, &g), te = randn({2, 3, 2, 2}, kFloat64, &g);
  const std::vector<double> sv = values(s), tv = values(te);
  double mse = 0;
  for (size_t i = 0; i < sv.size(); ++i) mse += (sv[i] - tv[i]) * (sv[i] - tv[i]);
  EXPECT_NEAR(compress::feature_distillation_loss(s, te).item<double>(), mse / 24, 1e-12);
  // cosine along the channels: 1 - cos averaged over the 2 x 2 x 2 positions
  double cos_loss = 0;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t p = 0; p < 4; ++p) {
      double dot = 0, ns = 0, nt = 0;
      for (int64_t c = 0; c < 3; ++c) {
        const size_t i = static_cast<size_t>(n * 12 + c * 4 + p);
        dot += sv[i] * tv[i], ns += sv[i] * sv[i], nt += tv[i] * tv[i];
      }
      cos_loss += 1 - dot / std::sqrt(ns * nt);
    }
  const Tensor got = compress::feature_distillation_loss(s, te, compress::FeatureLoss::Cosine, 1);
  EXPECT_NEAR(got.item<double>(), cos_loss / 8, 1e-12);
  const Tensor sl = leaf(s.clone()), tl = leaf(te.clone());
  compress::feature_distillation_loss(sl, tl, compress::FeatureLoss::Cosine).backward();
  EXPECT_TRUE(sl.grad().defined());
  EXPECT_FALSE(tl.grad().defined());
  EXPECT_TRUE(throws_with([&] { compress::feature_distillation_loss(s, te.slice(1, 0, 2)); }, {"FeatureAdapter"}));
}

TEST(Distillation, AdapterIsA1x1ConvolutionOnTheChannels) {
  Generator g(7);
  compress::FeatureAdapter adapter(3, 5, 1, {.generator = &g});
  adapter.to(kFloat64);
  const Tensor x = randn({2, 3, 2, 4}, kFloat64, &g);
  const Tensor y = adapter(x);
  ASSERT_EQ(y.shape(), (Shape{2, 5, 2, 4}));
  const auto w = values(adapter.proj.weight), b = values(adapter.proj.bias), xv = values(x);
  std::vector<double> want;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t o = 0; o < 5; ++o)
      for (int64_t p = 0; p < 8; ++p) {
        double acc = b[o];
        for (int64_t c = 0; c < 3; ++c) acc += w[o * 3 + c] * xv[n * 24 + c * 8 + p];
        want.push_back(acc);
      }
  EXPECT_TRUE(all_close(y, want, 1e-12, 1e-12));
  compress::FeatureAdapter seq(3, 5, -1);
  EXPECT_EQ(seq(randn({2, 7, 3}, kFloat32, &g)).shape(), (Shape{2, 7, 5}));
  EXPECT_TRUE(throws_with([&] { adapter(randn({2, 4, 2, 2}, kFloat64, &g)); }, {"FeatureAdapter", "3 channels"}));
}

TEST(Distillation, BadInputRaises) {
  const Tensor a = zeros({2, 3}), b = zeros({2, 4});
  EXPECT_TRUE(throws_with([&] { compress::distillation_loss(a, b); }, {"distillation_loss", "same shape"}));
  EXPECT_TRUE(throws_with([&] { compress::distillation_loss(a, a, {.temperature = 0}); }, {"temperature"}));
  EXPECT_TRUE(throws_with([&] { compress::distillation_loss(a, a, {.alpha = 1.5}); }, {"alpha"}));
  EXPECT_TRUE(throws_with([&] { compress::distillation_loss(a, a, {.reduction = "mean"}); }, {"batchmean"}));
  EXPECT_TRUE(throws_with([&] { compress::distillation_loss(zeros({3}), zeros({3})); }, {"(N, C)"}));
  nn::Linear m(2, 2);
  EXPECT_TRUE(throws_with([&] { compress::Distiller(m, m); }, {"different modules"}));
}

TEST(Distillation, IgnoredTargetsLeaveTheSoftTermToo) {
  // the positions whose target is ignore_index add nothing to either term; batchmean divides the
  // KL by the kept positions over the positions per sample
  Generator g(7);
  const Tensor s = randn({4, 5}, kFloat64, &g), te = randn({4, 5}, kFloat64, &g);
  const Tensor target = from_vector<int64_t>({2, -100, 4, -100});
  const Tensor s_kept = index_select(s, 0, from_vector<int64_t>({0, 2}));
  const Tensor te_kept = index_select(te, 0, from_vector<int64_t>({0, 2}));
  for (const char* r : {"batchmean", "sum"}) {
    SCOPED_TRACE(r);
    const Tensor got = compress::distillation_loss(s, te, {.temperature = 2, .alpha = 0.6, .reduction = r}, target);
    EXPECT_NEAR(got.item<double>(), reference(s_kept, te_kept, {2, 4}, 2, 0.6, r)[0], 1e-12);
  }
  const Tensor none = compress::distillation_loss(s, te, {.temperature = 2, .alpha = 0.6, .reduction = "none"}, target);
  const auto want = reference(s_kept, te_kept, {2, 4}, 2, 0.6, "none");
  EXPECT_TRUE(all_close(none, std::vector<double>{want[0], 0, want[1], 0}, 1e-12, 1e-12));

  // (N, C, L) with 3 of 8 positions ignored: the kept KL sum divided by 5 / 4
  const Tensor s3 = randn({2, 3, 4}, kFloat64, &g), te3 = randn({2, 3, 4}, kFloat64, &g);
  const std::vector<int64_t> labels{0, 1, -100, 2, -100, 0, 1, -100};  // (2, 4), n-major
  const Tensor got = compress::distillation_loss(s3, te3, {.temperature = 3, .alpha = 1},
                                                 from_vector<int64_t>(labels, Shape{2, 4}));
  const auto per = reference(s3.transpose(1, 2).reshape({8, 3}), te3.transpose(1, 2).reshape({8, 3}), {}, 3, 1, "none");
  double kept_sum = 0;
  for (size_t i = 0; i < per.size(); ++i)
    if (labels[i] != -100) kept_sum += per[i];
  EXPECT_NEAR(got.item<double>(), kept_sum / (5.0 / 4.0), 1e-12);
  // the gradient of the masked loss
  EXPECT_TRUE(gradcheck([&](V in) {
    return compress::distillation_loss(in[0], te, {.temperature = 2, .alpha = 0.5}, target);
  }, {leaf(randn({4, 5}, kFloat64, &g))}));
}
