// optim::swa_utils: AveragedModel's SWA mean and EMA against the formulas computed in float64
// here, buffers averaged or copied, the state dict's keys; SWALR against PyTorch's recursive
// get_lr; update_bn against the mean and unbiased variance of all the data.
#include <cmath>
#include <memory>
#include <numbers>
#include <vector>

#include "optim/scheduler_testing.h"

namespace strata {
namespace {

namespace swa = optim::swa_utils;
using testing::values;

// five weight snapshots of a Linear(3, 2), written into `model` one by one
std::vector<std::vector<double>> snapshots() {
  std::vector<std::vector<double>> out;
  for (int k = 0; k < 5; ++k) {
    std::vector<double> w;
    for (int i = 0; i < 6; ++i) w.push_back(std::sin(1.3 * k + 0.7 * i) + 0.1 * k);
    out.push_back(w);
  }
  return out;
}

void set_weight(nn::Linear& model, const std::vector<double>& w) {
  NoGradGuard no_grad;
  model.weight.copy_(from_vector(w, Shape{2, 3}).to(model.weight.dtype()));
}

TEST(SwaUtils, AveragedModelIsTheEqualWeightMean) {
  nn::Linear model(3, 2);
  set_weight(model, snapshots()[0]);
  swa::AveragedModel avg(model, std::make_unique<nn::Linear>(3, 2));
  EXPECT_EQ(avg.n_averaged(), 0);
  std::vector<double> sum(6, 0);
  int n = 0;
  for (const auto& w : snapshots()) {
    set_weight(model, w);
    avg.update_parameters(model);
    ++n;
    for (size_t i = 0; i < 6; ++i) sum[i] += w[i];
    std::vector<double> mean(6);
    for (size_t i = 0; i < 6; ++i) mean[i] = sum[i] / n;
    EXPECT_TRUE(testing::all_close(static_cast<nn::Linear&>(avg.module()).weight, mean, 1e-6, 1e-6)) << n;
  }
  EXPECT_EQ(avg.n_averaged(), 5);
  // the bias never changed: its average is itself
  EXPECT_EQ(values(static_cast<nn::Linear&>(avg.module()).bias), values(model.bias));
  const nn::StateDict sd = avg.state_dict();
  EXPECT_TRUE(sd.count("module.weight") && sd.count("module.bias") && sd.count("n_averaged"));
  // a checkpoint restores the count and the average
  swa::AveragedModel again(model, std::make_unique<nn::Linear>(3, 2));
  again.load_state_dict(sd);
  EXPECT_EQ(again.n_averaged(), 5);
  EXPECT_EQ(values(static_cast<nn::Linear&>(again.module()).weight),
            values(static_cast<nn::Linear&>(avg.module()).weight));
}

TEST(SwaUtils, EmaFollowsTheFormula) {
  nn::Linear model(3, 2);
  swa::AveragedModel ema(model, std::make_unique<nn::Linear>(3, 2), {.multi_avg_fn = swa::get_ema_multi_avg_fn(0.9)});
  std::vector<double> want;
  for (const auto& w : snapshots()) {
    set_weight(model, w);
    ema.update_parameters(model);
    if (want.empty()) want = w;  // the first update copies
    else
      for (size_t i = 0; i < 6; ++i) want[i] = 0.9 * want[i] + 0.1 * w[i];
  }
  EXPECT_TRUE(testing::all_close(static_cast<nn::Linear&>(ema.module()).weight, want, 1e-6, 1e-6));
  EXPECT_TRUE(testing::throws_with([] { swa::get_ema_multi_avg_fn(1.5); }, {"decay"}));
}

TEST(SwaUtils, BuffersAveragedOrCopied) {
  nn::BatchNorm1d model(2);
  swa::AveragedModel copied(model, std::make_unique<nn::BatchNorm1d>(2));
  swa::AveragedModel averaged(model, std::make_unique<nn::BatchNorm1d>(2), {.use_buffers = true});
  auto& c = static_cast<nn::BatchNorm1d&>(copied.module());
  auto& a = static_cast<nn::BatchNorm1d&>(averaged.module());
  const std::vector<std::vector<double>> means = {{1, 2}, {3, 6}, {5, 1}};
  for (const auto& m : means) {
    {
      NoGradGuard no_grad;
      model.running_mean.copy_(from_vector(m).to(kFloat32));
      model.num_batches_tracked.add_(1);
    }
    copied.update_parameters(model);
    averaged.update_parameters(model);
  }
  EXPECT_TRUE(testing::all_close(c.running_mean, {5, 1}, 0, 0));
  EXPECT_TRUE(testing::all_close(a.running_mean, {3, 3}, 1e-6, 1e-6));
  EXPECT_EQ(a.num_batches_tracked.item<int64_t>(), 3);  // integer buffers are copied
  EXPECT_TRUE(testing::throws_with([&] { swa::AveragedModel(model, std::make_unique<nn::BatchNorm1d>(3)); },
                                   {"AveragedModel", "'weight'", "[3]"}));
  EXPECT_TRUE(testing::throws_with([&] { swa::AveragedModel(model, std::make_unique<nn::Linear>(2, 2)); },
                                   {"AveragedModel"}));
}

// PyTorch's SWALR.get_lr, recursive in the group's lr
double swalr_recursive(int64_t step_count, double lr, double swa_lr, int64_t anneal_epochs, bool cos) {
  auto f = [&](double t) { return cos ? (1 - std::cos(std::numbers::pi * t)) / 2 : t; };
  int64_t step = step_count - 1;
  if (anneal_epochs == 0) step = std::max<int64_t>(1, step);
  const double denom = static_cast<double>(std::max<int64_t>(1, anneal_epochs));
  const double prev_alpha = f(std::clamp(static_cast<double>(step - 1) / denom, 0.0, 1.0));
  const double prev_lr = prev_alpha == 1 ? swa_lr : (lr - prev_alpha * swa_lr) / (1 - prev_alpha);
  const double alpha = f(std::clamp(static_cast<double>(step) / denom, 0.0, 1.0));
  return swa_lr * alpha + prev_lr * (1 - alpha);
}

TEST(SwaUtils, SWALRMatchesPyTorch) {
  for (int64_t anneal : {0, 1, 5}) {
    for (bool cos : {true, false}) {
      testing::Fixture f;
      const double start[2] = {f.opt->lr(0), f.opt->lr(1)};
      swa::SWALR s(*f.opt, {0.01, 0.03}, anneal, cos ? swa::SWALR::Anneal::Cos : swa::SWALR::Anneal::Linear);
      const double swa_lr[2] = {0.01, 0.03};
      double lr[2] = {start[0], start[1]};
      for (int64_t e = 0; e < 9; ++e) {
        if (e > 0) s.step();
        for (size_t g = 0; g < 2; ++g) {
          lr[g] = swalr_recursive(e + 1, lr[g], swa_lr[g], anneal, cos);
          EXPECT_NEAR(f.opt->lr(g), lr[g], 1e-12) << "anneal " << anneal << " step " << e;
        }
      }
      EXPECT_NEAR(f.opt->lr(1), 0.03, 1e-15);
    }
  }
  testing::Fixture f;
  EXPECT_TRUE(testing::throws_with([&] { swa::SWALR(*f.opt, -1.0); }, {"swa_lr"}));
  EXPECT_TRUE(testing::throws_with([&] { swa::SWALR(*f.opt, 0.1, -1); }, {"anneal_epochs"}));
}

TEST(SwaUtils, UpdateBnRecomputesStatisticsOverAllTheData) {
  nn::BatchNorm1d bn(2);
  bn.eval();
  std::vector<Tensor> batches;
  std::vector<std::vector<double>> column(2);
  for (int b = 0; b < 3; ++b) {
    std::vector<double> x;
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 2; ++c) {
        const double v = std::cos(0.9 * (b * 4 + i) + c) * (c + 1) + b;
        x.push_back(v);
        column[c].push_back(v);
      }
    batches.push_back(from_vector(x, Shape{4, 2}).to(kFloat32));
  }
  {  // stale statistics, which update_bn must discard rather than average into
    NoGradGuard no_grad;
    bn.running_mean.copy_(from_vector(std::vector<double>{50, -50}).to(kFloat32));
    bn.running_var.copy_(from_vector(std::vector<double>{9, 9}).to(kFloat32));
    bn.num_batches_tracked.add_(7);
  }
  swa::update_bn(batches, bn);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 3);
  // cumulative averages of the batch means and unbiased batch variances
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int b = 0; b < 3; ++b) {
      double m = 0, v = 0;
      for (int i = 0; i < 4; ++i) m += column[c][b * 4 + i] / 4;
      for (int i = 0; i < 4; ++i) v += std::pow(column[c][b * 4 + i] - m, 2) / 3;
      mean += m / 3, var += v / 3;
    }
    EXPECT_NEAR(values(bn.running_mean)[c], mean, 1e-5);
    EXPECT_NEAR(values(bn.running_var)[c], var, 1e-5);
  }
  EXPECT_EQ(bn.options.momentum, std::optional<double>(0.1));
  EXPECT_FALSE(bn.is_training());
  nn::Linear no_bn(2, 2);
  swa::update_bn(batches, no_bn);  // nothing to do
  EXPECT_TRUE(no_bn.is_training());
}

}  // namespace
}  // namespace strata
