// Batch normalization against plain-loop float64 references written here, in NCHW,
// channels-last and non-dense layouts, float32 and float64: running statistics over several
// steps, finite-difference gradient checks in float64, the kernel's float channel sums, the
// fused residual add and ReLU (batch_norm_relu) against the separate ops; and bad input.
#include <cmath>
#include <random>

#include "kernels/cpu/batch_norm.h"
#include "nn/image_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::as_image;
using strata::testing::expected_format;
using strata::testing::gradcheck;
using strata::testing::has_format;
using strata::testing::Image;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

// ---- batch normalization -------------------------------------------------------------------------------

namespace {

// Per-channel mean and biased variance of (N, C, *) values.
void channel_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t c = x.size(1), per = x.numel() / x.size(0) / c;
  std::vector<double> v = values(x);
  mean.assign(static_cast<size_t>(c), 0.0);
  var.assign(static_cast<size_t>(c), 0.0);
  const double m = double(x.numel() / c);
  for (size_t i = 0; i < v.size(); ++i) mean[(i / per) % c] += v[i] / m;
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = v[i] - mean[(i / per) % c];
    var[(i / per) % c] += d * d / m;
  }
}

std::vector<double> normalize_reference(const Tensor& x, const std::vector<double>& mean,
                                        const std::vector<double>& var, const std::vector<double>& w,
                                        const std::vector<double>& b, double eps) {
  const int64_t c = x.size(1), per = x.numel() / x.size(0) / c;
  std::vector<double> v = values(x);
  for (size_t i = 0; i < v.size(); ++i) {
    const size_t ch = (i / per) % c;
    v[i] = (v[i] - mean[ch]) / std::sqrt(var[ch] + eps) * (w.empty() ? 1.0 : w[ch]) + (b.empty() ? 0.0 : b[ch]);
  }
  return v;
}

}  // namespace

TEST(BatchNorm, TrainingAndEvalMatchReferenceOverSteps) {
  for (DType dt : {kFloat32, kFloat64})
    for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced, Image::SlicedNHWC}) {
      SCOPED_TRACE(fmt::format("{} {}", dt, strata::testing::image_name(l)));
      Generator g(80);
      nn::BatchNorm2d bn(3, {.momentum = 0.2});
      bn.to(dt);
      {
        NoGradGuard no_grad;
        bn.weight.copy_(from_vector<double>({0.5, 2.0, -1.0}));
        bn.bias.copy_(from_vector<double>({0.1, -0.3, 2.0}));
      }
      std::vector<double> rm(3, 0.0), rv(3, 1.0), mean, var;
      for (int step = 0; step < 4; ++step) {
        // a mean far from zero checks the variance does not cancel
        Tensor x64 = randn({4, 3, 5, 3}, kFloat64, &g) * 3.0 + 50.0;
        Tensor x = as_image(x64.to(dt), l);
        Tensor y = bn(x);
        channel_stats(x64, mean, var);
        EXPECT_TRUE(has_format(y, expected_format(x, l)));
        EXPECT_TRUE(all_close(y, normalize_reference(x64, mean, var, {0.5, 2.0, -1.0}, {0.1, -0.3, 2.0}, 1e-5),
                              dt == kFloat64 ? 1e-10 : 1e-4, dt == kFloat64 ? 1e-10 : 1e-4));
        const double n = 4 * 5 * 3;
        for (size_t c = 0; c < 3; ++c) {
          rm[c] = 0.8 * rm[c] + 0.2 * mean[c];
          rv[c] = 0.8 * rv[c] + 0.2 * var[c] * n / (n - 1);  // the unbiased variance
        }
      }
      const double t = dt == kFloat64 ? 1e-10 : 1e-4;
      EXPECT_TRUE(all_close(bn.running_mean, rm, t, t));
      EXPECT_TRUE(all_close(bn.running_var, rv, t, t));
      EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 4);
      EXPECT_EQ(bn.num_batches_tracked.dtype(), kInt64);
      // eval: the running statistics, which stay put
      bn.eval();
      Tensor x64 = randn({2, 3, 4, 4}, kFloat64, &g);
      Tensor x = as_image(x64.to(dt), l);
      EXPECT_TRUE(all_close(bn(x), normalize_reference(x64, rm, rv, {0.5, 2.0, -1.0}, {0.1, -0.3, 2.0}, 1e-5), t, t));
      EXPECT_TRUE(all_close(bn.running_mean, rm, t, t));
      EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 4);
    }
}

TEST(BatchNorm, CumulativeMomentumNoAffineAndNoTracking) {
  Generator g(90);
  nn::BatchNorm1d bn(4, {.momentum = std::nullopt, .affine = false});
  EXPECT_FALSE(bn.weight.defined());
  std::vector<double> sum_mean(4, 0.0), sum_var(4, 0.0), mean, var;
  for (int step = 1; step <= 3; ++step) {
    Tensor x = randn({6, 4, 5}, kFloat64, &g) + double(step);  // (N, C, L)
    Tensor y = bn(x.to(kFloat32));
    channel_stats(x, mean, var);
    EXPECT_TRUE(all_close(y, normalize_reference(x, mean, var, {}, {}, 1e-5), 1e-4, 1e-4));
    for (size_t c = 0; c < 4; ++c) sum_mean[c] += mean[c], sum_var[c] += var[c] * 30.0 / 29.0;
  }
  // momentum = None: the running statistics are plain averages over the batches seen
  for (size_t c = 0; c < 4; ++c) sum_mean[c] /= 3, sum_var[c] /= 3;
  EXPECT_TRUE(all_close(bn.running_mean, sum_mean, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(bn.running_var, sum_var, 1e-5, 1e-5));

  // without running statistics, eval normalizes with the batch's
  nn::BatchNorm1d untracked(4, {.track_running_stats = false});
  EXPECT_EQ(untracked.state_dict().size(), 2u);
  untracked.eval();
  Tensor x = randn({5, 4}, kFloat64, &g);
  channel_stats(x, mean, var);
  EXPECT_TRUE(all_close(untracked(x.to(kFloat32)), normalize_reference(x, mean, var, {}, {}, 1e-5), 1e-4, 1e-4));

  nn::BatchNorm2d named(8);
  auto sd = named.state_dict();
  for (const char* key : {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})
    EXPECT_TRUE(sd.count(key)) << key;
  EXPECT_EQ(named.parameters().size(), 2u);
}

TEST(BatchNorm, GradientsByFiniteDifferences) {
  Generator g(100);
  for (bool training : {true, false})
    for (Image l : {Image::NCHW, Image::NHWC}) {
      SCOPED_TRACE(fmt::format("training {} {}", training, strata::testing::image_name(l)));
      Tensor x = as_image(randn({3, 4, 3, 2}, kFloat64, &g), l).requires_grad_();
      Tensor w = randn({4}, kFloat64, &g).requires_grad_(), b = randn({4}, kFloat64, &g).requires_grad_();
      Tensor rm = randn({4}, kFloat64, &g), rv = rand({4}, kFloat64, &g) + 0.5;
      const F::BatchNormArgs a{training, 0.1, 1e-5};
      // running statistics are copied per call, so the perturbed evaluations see the same ones
      EXPECT_TRUE(gradcheck([&](V in) { return F::batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], a); },
                            {x, w, b}));
    }
  // BatchNorm1d shapes, and no weight at all
  Tensor x2 = randn({5, 3}, kFloat64, &g).requires_grad_();
  EXPECT_TRUE(gradcheck([&](V in) { return F::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), {true}); },
                        {x2}));
  Tensor x3 = randn({2, 3, 4}, kFloat64, &g).requires_grad_();
  Tensor w3 = randn({3}, kFloat64, &g).requires_grad_();
  EXPECT_TRUE(gradcheck([&](V in) { return F::batch_norm(in[0], Tensor(), Tensor(), in[1], Tensor(), {true}); },
                        {x3, w3}));
}

TEST(BatchNorm, Float32GradientsMatchFloat64) {
  Generator g(110);
  Tensor x64 = randn({4, 6, 5, 7}, kFloat64, &g) + 3.0, w64 = randn({6}, kFloat64, &g), b64 = randn({6}, kFloat64, &g);
  Tensor gy = randn({4, 6, 5, 7}, kFloat64, &g);
  std::vector<std::vector<double>> want;
  for (DType dt : {kFloat64, kFloat32})
    for (Image l : {Image::NCHW, Image::NHWC}) {
      Tensor x = as_image(x64.to(dt), l).requires_grad_();
      Tensor w = w64.to(dt).detach().requires_grad_(), b = b64.to(dt).detach().requires_grad_();
      Tensor y = F::batch_norm(x, Tensor(), Tensor(), w, b, {true});
      std::vector<Tensor> gr = autograd::grad({y}, {x, w, b}, {as_image(gy.to(dt), l)});
      EXPECT_TRUE(has_format(gr[0], expected_format(x, l)));
      if (want.empty()) {
        for (const Tensor& t : gr) want.push_back(values(t));
        continue;
      }
      for (size_t j = 0; j < 3; ++j) EXPECT_TRUE(all_close(gr[j], want[j], 1e-4, 1e-4)) << dt << " " << j;
    }
}

// Rows longer than one float run (Note [Float channel sums]: 1024 elements) with a mean away
// from zero: float32 matches the same float32 inputs computed in float64, forward and backward.
// (A mean hundreds of spreads from zero costs float32 its accuracy anyway: the saved mean is a
// float, and its rounding shifts every normalized value of the channel alike.)
TEST(BatchNorm, Float32LongRowsMatchFloat64) {
  Generator g(120);
  Tensor x32 = (randn({2, 3, 33, 37}, kFloat64, &g) * 0.5 + 5.0).to(kFloat32);
  Tensor gy32 = randn({2, 3, 33, 37}, kFloat32, &g);
  Tensor w64 = from_vector<double>({0.5, 2.0, -1.0}), b64 = from_vector<double>({0.1, -0.3, 2.0});
  std::vector<std::vector<double>> want;
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor x = x32.to(dt).detach().requires_grad_();
    Tensor w = w64.to(dt).detach().requires_grad_(), b = b64.to(dt).detach().requires_grad_();
    Tensor y = F::batch_norm(x, Tensor(), Tensor(), w, b, {true});
    std::vector<Tensor> gr = autograd::grad({y}, {x, w, b}, {gy32.to(dt)});
    if (want.empty()) {
      want.push_back(values(y));
      for (const Tensor& t : gr) want.push_back(values(t));
      continue;
    }
    EXPECT_TRUE(all_close(y, want[0], 1e-4, 1e-4));
    for (size_t j = 0; j < 3; ++j) EXPECT_TRUE(all_close(gr[j], want[j + 1], 1e-4, 1e-4)) << j;
  }
}

// The kernel's sums themselves, where a shift rounded to float would show: sum(gy) and
// sum(gy * (x - mean)) with x near 1000 and a mean that is not a float, rows of 15 (no vector),
// 16, and 1221 (two float runs and a tail) elements, against float64 sums of the same floats.
TEST(BatchNorm, ChannelSumsOfFloatsMatchFloat64) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  for (int64_t s : {15, 16, 1221}) {
    SCOPED_TRACE(fmt::format("row of {}", s));
    const cpu::ChannelShape sh{2, 3, s};
    const cpu::ChannelStrides st{3 * s, s, 1};
    std::vector<float> gy(static_cast<size_t>(6 * s)), x(gy.size());
    for (size_t i = 0; i < gy.size(); ++i) gy[i] = float(normal(rng)), x[i] = float(1000 + 0.01 * normal(rng));
    std::vector<double> mean(3, 0.0), want1(3, 0.0), want2(3, 0.0), abs2(3, 0.0);
    for (size_t i = 0; i < x.size(); ++i) mean[(i / s) % 3] += x[i] / double(2 * s);
    for (double& m : mean) m += 1e-9;  // certainly not a float
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t c = (i / s) % 3;
      want1[c] += gy[i];
      want2[c] += gy[i] * (x[i] - mean[c]);
      abs2[c] += std::fabs(gy[i] * (x[i] - mean[c]));
    }
    std::vector<double> s1(3), s2(3);
    cpu::channel_sums(gy.data(), x.data(), sh, st, nullptr, mean.data(), s1.data(), s2.data());
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_NEAR(s1[c], want1[c], 1e-5 * double(2 * s));
      EXPECT_NEAR(s2[c], want2[c], 1e-5 * abs2[c]) << "channel " << c;
    }
  }
}

// Training statistics are the same bits whatever the thread count (the rows' chunks depend on
// the sizes alone), in both memory formats.
TEST(BatchNorm, ThreadCountDoesNotChangeResults) {
  const int before = get_num_threads();
  const Tensor x = (randn({16, 3, 37, 41}, kFloat64) * 3 + 1.7);
  for (MemoryFormat f : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    std::vector<Tensor> ys;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      ys.push_back(F::batch_norm(x.to(f), Tensor(), Tensor(), Tensor(), Tensor(), {.training = true}).contiguous());
    }
    EXPECT_TRUE(equal(ys[0], ys[1]));
    EXPECT_TRUE(equal(ys[0], ys[2]));
  }
  set_num_threads(before);
}

// An empty batch trains as in PyTorch: an empty output, the running statistics left alone, the
// batch counted, and zero gradients for the affine parameters.
TEST(BatchNorm, EmptyBatchInTraining) {
  nn::BatchNorm1d bn(3);
  Tensor x = randn({0, 3}).requires_grad_();
  Tensor y = bn(x);
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  EXPECT_TRUE(all_close(bn.running_mean, {0, 0, 0}, 0, 0));
  EXPECT_TRUE(all_close(bn.running_var, {1, 1, 1}, 0, 0));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  y.sum().backward();
  EXPECT_EQ(x.grad().shape(), (Shape{0, 3}));
  EXPECT_TRUE(all_close(bn.weight.grad(), {0, 0, 0}, 0, 0));
  EXPECT_TRUE(all_close(bn.bias.grad(), {0, 0, 0}, 0, 0));
  nn::BatchNorm2d untracked(2, {.track_running_stats = false});
  EXPECT_EQ(untracked(randn({0, 2, 3, 3})).shape(), (Shape{0, 2, 3, 3}));
}

TEST(BatchNorm, BadInputRaises) {
  nn::BatchNorm2d bn(3);
  EXPECT_TRUE(throws_with([&] { bn(randn({2, 3, 4})); }, {"BatchNorm2d(3)", "4-d", "[2, 3, 4]"}));
  EXPECT_TRUE(throws_with([&] { bn(randn({2, 4, 5, 5})); }, {"BatchNorm2d(3)", "3 channels", "[2, 4, 5, 5]"}));
  EXPECT_TRUE(throws_with([&] { bn(randn({1, 3, 1, 1})); }, {"more than 1 value per channel"}));
  nn::BatchNorm1d bn1(3);
  EXPECT_TRUE(throws_with([&] { bn1(randn({2, 3, 4, 4})); }, {"BatchNorm1d(3)", "2-d"}));
  EXPECT_TRUE(throws_with([&] { bn1(randn({2, 5})); }, {"BatchNorm1d(3)", "3 channels"}));
  EXPECT_TRUE(throws_with([] { nn::BatchNorm2d(0); }, {"num_features"}));
  EXPECT_TRUE(throws_with([] { nn::BatchNorm2d(3, {.momentum = 1.5}); }, {"momentum"}));
  Tensor x = randn({2, 3, 4, 4});
  EXPECT_TRUE(throws_with([&] { F::batch_norm(x, Tensor(), Tensor()); }, {"running_mean"}));
  EXPECT_TRUE(throws_with([&] { F::batch_norm(x, zeros({4}), ones({3})); }, {"running_mean", "(3)"}));
  EXPECT_TRUE(throws_with([&] { F::batch_norm(x, zeros({3}), ones({3}), ones({2})); }, {"weight"}));
  EXPECT_TRUE(throws_with([&] { F::batch_norm(randn({3}), zeros({3}), ones({3})); }, {"(N, C, *)"}));
  EXPECT_TRUE(throws_with([&] { F::batch_norm(x.to(kInt32), zeros({3}), ones({3})); }, {"floating"}));
  EXPECT_TRUE(throws_with([&] { bn(x.to(kInt64)); }, {"floating"}));
  bn.options.eps = -1;
  EXPECT_TRUE(throws_with([&] { bn(x); }, {"eps"}));
  bn.options.eps = 1e-5;
  // a failed call leaves the running statistics and the batch count alone
  EXPECT_TRUE(all_close(bn.running_mean, {0, 0, 0}, 0, 0));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  // the functional form checks momentum, and checks both buffers before writing either
  Tensor rm = zeros({3}), rv = ones({3});
  for (double m : {-0.1, 1.5, std::nan("")})
    EXPECT_TRUE(throws_with([&] { F::batch_norm(x, rm, rv, Tensor(), Tensor(), {.training = true, .momentum = m}); },
                            {"momentum"}));
  Tensor shared_var = ones({1}).expand({3});
  EXPECT_TRUE(throws_with([&] { F::batch_norm(x, rm, shared_var, Tensor(), Tensor(), {.training = true}); },
                          {"share memory"}));
  EXPECT_TRUE(all_close(rm, {0, 0, 0}, 0, 0));
}

// ---- batch_norm_relu: BN, the residual add and ReLU in one pass --------------------------------

// relu(batch_norm(x) + residual) through the three separate ops, on its own copies of the
// running statistics; returns the output, and the gradients of x, weight, bias and residual
// (when it requires one: without, the backward applies the ReLU's mask inside its kernel).
namespace {

struct BnReluResult {
  Tensor y, rm, rv;
  std::vector<Tensor> grads;
};

BnReluResult bn_relu_run(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& r0,
                         const Tensor& rm0, const Tensor& rv0, const Tensor& gy, bool training,
                         bool residual_grad = true) {
  Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  Tensor r = r0.defined() ? r0.detach().requires_grad_(residual_grad) : Tensor();
  Tensor rm = rm0.clone(), rv = rv0.clone();
  const F::BatchNormArgs a{training, 0.1, 1e-5};
  Tensor y = fused ? F::batch_norm_relu(x, rm, rv, w, b, a, r)
                   : F::relu(r.defined() ? F::batch_norm(x, rm, rv, w, b, a) + r : F::batch_norm(x, rm, rv, w, b, a));
  std::vector<Tensor> inputs{x, w, b};
  if (r.defined() && residual_grad) inputs.push_back(r);
  return {y, rm, rv, autograd::grad({y}, inputs, {gy})};
}

}  // namespace

TEST(BatchNormRelu, MatchesBatchNormAddReluComposed) {
  Generator g(130);
  for (DType dt : {kFloat32, kFloat64})
    for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced, Image::SlicedNHWC})
      for (int residual : {0, 1, 2, 3})  // none, in the input's layout, in NCHW, without a gradient
        for (bool training : {true, false}) {
          SCOPED_TRACE(fmt::format("{} {} residual {} training {}", dt, strata::testing::image_name(l), residual,
                                   training));
          // shifted so that about a third of the outputs are cut by the ReLU
          Tensor x = as_image((randn({3, 4, 5, 4}, kFloat64, &g) * 2.0 + 1.0).to(dt), l);
          Tensor w = randn({4}, dt, &g), b = randn({4}, dt, &g);
          Tensor rm = randn({4}, dt, &g), rv = rand({4}, dt, &g) + 0.5;
          Tensor r = residual == 0 ? Tensor()
                     : residual != 2 ? as_image(randn({3, 4, 5, 4}, dt, &g), l)
                                     : randn({3, 4, 5, 4}, dt, &g);
          Tensor gy = as_image(randn({3, 4, 5, 4}, dt, &g), l);
          const BnReluResult want = bn_relu_run(false, x, w, b, r, rm, rv, gy, training, residual != 3);
          const BnReluResult got = bn_relu_run(true, x, w, b, r, rm, rv, gy, training, residual != 3);
          const double t = dt == kFloat64 ? 1e-12 : 1e-5;
          EXPECT_TRUE(has_format(got.y, expected_format(x, l)));
          EXPECT_TRUE(all_close(got.y, values(want.y), t, t));
          EXPECT_GT(values(eq(got.y, 0.0).to(kFloat64).sum())[0], 10.0);  // the ReLU did cut
          EXPECT_TRUE(all_close(got.rm, values(want.rm), t, t));
          EXPECT_TRUE(all_close(got.rv, values(want.rv), t, t));
          ASSERT_EQ(got.grads.size(), want.grads.size());
          for (size_t j = 0; j < got.grads.size(); ++j)
            EXPECT_TRUE(all_close(got.grads[j], values(want.grads[j]), 10 * t, 10 * t)) << "gradient " << j;
        }
}

TEST(BatchNormRelu, GradientsByFiniteDifferences) {
  Generator g(140);
  for (Image l : {Image::NCHW, Image::NHWC}) {
    SCOPED_TRACE(strata::testing::image_name(l));
    Tensor x = as_image(randn({3, 4, 3, 2}, kFloat64, &g), l).requires_grad_();
    Tensor r = randn({3, 4, 3, 2}, kFloat64, &g).requires_grad_();
    Tensor w = randn({4}, kFloat64, &g).requires_grad_(), b = randn({4}, kFloat64, &g).requires_grad_();
    EXPECT_TRUE(gradcheck(
        [&](V in) { return F::batch_norm_relu(in[0], Tensor(), Tensor(), in[1], in[2], {true}, in[3]); },
        {x, w, b, r}));
    EXPECT_TRUE(gradcheck([&](V in) { return F::batch_norm_relu(in[0], Tensor(), Tensor(), in[1], in[2], {true}); },
                          {x, w, b}));
  }
}

TEST(BatchNormRelu, LayerForwardReluTracksStatisticsLikeForward) {
  Generator g(150);
  nn::BatchNorm2d fused(3), plain(3);
  Tensor x = randn({2, 3, 4, 4}, kFloat32, &g), r = randn({2, 3, 4, 4}, kFloat32, &g);
  Tensor y = fused.forward_relu(x, r);
  EXPECT_TRUE(all_close(y, values(F::relu(plain(x) + r)), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(fused.running_mean, values(plain.running_mean), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(fused.running_var, values(plain.running_var), 1e-6, 1e-6));
  EXPECT_EQ(fused.num_batches_tracked.item<int64_t>(), 1);
  fused.eval(), plain.eval();
  EXPECT_TRUE(all_close(fused.forward_relu(x), values(F::relu(plain(x))), 1e-5, 1e-5));
}

TEST(BatchNormRelu, BadInputRaises) {
  nn::BatchNorm2d bn(3);
  Tensor x = randn({2, 3, 4, 4});
  EXPECT_TRUE(throws_with([&] { bn.forward_relu(x, randn({2, 3, 4, 5})); },
                          {"BatchNorm2d(3)", "residual", "[2, 3, 4, 5]"}));
  EXPECT_TRUE(throws_with([&] { bn.forward_relu(x, randn({2, 3, 4, 4}, kFloat64)); },
                          {"BatchNorm2d(3)", "residual", "float64"}));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);  // failed calls are not counted
  EXPECT_TRUE(throws_with(
      [&] { F::batch_norm_relu(x, zeros({3}), ones({3}), Tensor(), Tensor(), {}, randn({3, 4, 4})); },
      {"batch_norm_relu", "residual", "[3, 4, 4]"}));
  EXPECT_TRUE(throws_with([&] { F::batch_norm_relu(x, Tensor(), Tensor()); }, {"batch_norm_relu", "running_mean"}));
}

// Sequential runs BatchNorm2d then ReLU as one batch_norm_relu: the same output and gradients
// as the two modules called in turn; a ReLU subclass (its own forward) is left alone.
TEST(BatchNormRelu, SequentialFusesBatchNormThenRelu) {
  Generator g(160);
  nn::Sequential fused(nn::Conv2d(3, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(), nn::Conv2d(4, 2, 1));
  nn::Sequential plain(nn::Conv2d(3, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(), nn::Conv2d(4, 2, 1));
  {
    NoGradGuard no_grad;
    auto a = fused.parameters(), b = plain.parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  Tensor x = randn({2, 3, 5, 5}, kFloat32, &g);
  Tensor want = x;
  for (nn::Module* m : plain) want = m->forward(want);  // each module on its own
  Tensor got = fused(x);
  EXPECT_TRUE(all_close(got, values(want), 1e-6, 1e-6));
  // the last conv's input came from one batch_norm_relu node
  const auto& edges = got.grad_fn()->next_edges;
  ASSERT_FALSE(edges.empty());
  ASSERT_TRUE(edges[0].valid());
  EXPECT_EQ(edges[0].node->name(), "batch_norm_relu");
  got.sum().backward(), want.sum().backward();
  auto a = fused.parameters(), b = plain.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(all_close(a[i].grad(), values(b[i].grad()), 1e-5, 1e-5)) << i;
  auto& bn_fused = fused.at<nn::BatchNorm2d>(1);
  EXPECT_TRUE(all_close(bn_fused.running_var, values(plain.at<nn::BatchNorm2d>(1).running_var), 1e-6, 1e-6));

  struct CountingReLU : nn::ReLU {
    int calls = 0;
    Tensor forward(const Tensor& input) override { return ++calls, nn::ReLU::forward(input); }
  };
  nn::Sequential custom(nn::BatchNorm2d(3), CountingReLU());
  custom(x);
  EXPECT_EQ(custom.at<CountingReLU>(1).calls, 1);
}

// 16-bit data: the backward with the ReLU's mask inside its kernel against the separate ops on
// the same rounded inputs.
TEST(BatchNormRelu, HalfPrecisionMaskInKernel) {
  Generator g(131);
  for (DType dt : {kFloat16, kBFloat16})
    for (Image l : {Image::NCHW, Image::NHWC}) {
      SCOPED_TRACE(fmt::format("{} {}", dt, strata::testing::image_name(l)));
      Tensor x = as_image((randn({3, 4, 5, 4}, kFloat64, &g) * 2.0 + 1.0).to(dt), l);
      Tensor w = randn({4}, kFloat32, &g), b = randn({4}, kFloat32, &g);
      Tensor rm = zeros({4}), rv = ones({4}), gy = as_image(randn({3, 4, 5, 4}, kFloat64, &g).to(dt), l);
      const BnReluResult want = bn_relu_run(false, x, w, b, Tensor(), rm, rv, gy, true);
      const BnReluResult got = bn_relu_run(true, x, w, b, Tensor(), rm, rv, gy, true);
      const double t = dt == kFloat16 ? 4e-3 : 3e-2;
      for (size_t j = 0; j < got.grads.size(); ++j)
        EXPECT_TRUE(all_close(got.grads[j], values(want.grads[j]), t, t)) << "gradient " << j;
    }
}
