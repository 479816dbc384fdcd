// GradScaler: its scale trajectory over a scripted run of clean and inf/NaN steps against
// torch.amp.GradScaler's published update rule, skipped steps that leave parameters and
// optimizer state untouched, its stage errors, the disabled pass-through, state dicts and a
// checkpoint resumed into fresh objects, and an MLP trained under bfloat16 autocast with it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include <strata/strata.hpp>

#include "temp_dir.h"
#include "testing.h"

using namespace strata;
namespace F = strata::nn::functional;
using strata::testing::values;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// torch.amp.GradScaler's rule (_amp_update_scale_), written out independently of the library.
struct ReferenceScaler {
  double scale, growth, backoff;
  int64_t interval, tracker = 0;
  void update(bool found_inf) {
    if (found_inf) {
      scale = static_cast<float>(scale * backoff);
      tracker = 0;
    } else if (++tracker == interval) {
      const float grown = static_cast<float>(scale * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    }
  }
};

std::vector<double> state_values(const optim::Optimizer& opt) {
  std::vector<double> out;
  optim::StateDict d = opt.state_dict();
  for (const auto& [k, t] : d.tensors)
    for (double v : values(t)) out.push_back(v);
  for (const auto& [k, v] : d.scalars) out.push_back(v);
  return out;
}

}  // namespace

TEST(GradScaler, DefaultsArePyTorchs) {
  amp::GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_TRUE(s.is_enabled());
  const Tensor loss = full({}, 1.5);
  const Tensor scaled = s.scale(loss);
  EXPECT_EQ(scaled.dtype(), kFloat32);
  EXPECT_EQ(values(scaled)[0], 1.5 * 65536);
}

// A scripted run: gradient c (finite) or c with an inf or NaN; growth_interval 3.
TEST(GradScaler, ScaleFollowsTheUpdateRuleAndInfStepsAreSkipped) {
  const Tensor p = full({3}, 1.0).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.25, .momentum = 0.5});
  amp::GradScaler scaler({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.25, .growth_interval = 3});
  ReferenceScaler ref{1024, 2, 0.25, 3};
  // 0: clean, 1: inf, 2: NaN
  const std::vector<int> script = {0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0};
  std::vector<double> p_want = values(p), buf(3, 0.0);
  bool has_buf = false;
  for (size_t s = 0; s < script.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const std::vector<double> c = {0.5, -1.0, 0.125 * static_cast<double>(s + 1)};
    const Tensor coef = tensor({c[0], script[s] == 1 ? kInf : c[1], script[s] == 2 ? NAN : c[2]}, kFloat32);
    opt.zero_grad();
    scaler.scale(sum(p * coef)).backward();
    const std::vector<double> p_before = values(p), state_before = state_values(opt);
    const bool stepped = scaler.step(opt);
    EXPECT_EQ(stepped, script[s] == 0);
    if (script[s] == 0) {
      // the unscaled gradient is c exactly (the scale is a power of two); SGD with momentum
      EXPECT_EQ(values(p.grad()), c);
      for (size_t i = 0; i < 3; ++i) {
        buf[i] = has_buf ? 0.5 * buf[i] + c[i] : c[i];
        p_want[i] -= 0.25 * buf[i];
      }
      has_buf = true;
      EXPECT_TRUE(strata::testing::all_close(p, p_want, 1e-6, 1e-7));
    } else {
      EXPECT_EQ(values(p), p_before);
      EXPECT_EQ(state_values(opt), state_before);
    }
    scaler.update();
    ref.update(script[s] != 0);
    EXPECT_EQ(scaler.get_scale(), ref.scale);
    EXPECT_EQ(scaler.growth_tracker(), ref.tracker);
  }
  // the run grew and backed off: 1024 -> 2048 (3 clean) -> 512 (inf) -> 1024 ... as the rule says
  EXPECT_NE(ref.scale, 1024.0);
}

TEST(GradScaler, GrowthWaitsForGrowthIntervalCleanStepsAndStaysFinite) {
  const Tensor p = full({2}, 1.0).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 3e38, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 2});
  for (int s = 0; s < 4; ++s) {
    opt.zero_grad();
    p.set_grad(full({2}, 1.0));
    scaler.step(opt);
    scaler.update();
  }
  // growing 3e38 would overflow float: the scale stays, the tracker resets each interval
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(3e38f));
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, StageErrors) {
  const Tensor p = full({2}, 1.0).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  amp::GradScaler scaler;
  EXPECT_TRUE(strata::testing::throws_with([&] { scaler.update(); }, {"[GradScaler]", "no inf checks"}));
  scaler.scale(sum(p)).backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(strata::testing::throws_with([&] { scaler.unscale_(opt); },
                                           {"[GradScaler]", "unscale_() has already been called"}));
  EXPECT_EQ(values(p.grad()), (std::vector<double>{1, 1}));  // divided once only
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(strata::testing::throws_with([&] { scaler.step(opt); }, {"step() has already been called"}));
  EXPECT_TRUE(strata::testing::throws_with([&] { scaler.unscale_(opt); }, {"unscale_() is being called after step()"}));
  scaler.update();
  EXPECT_TRUE(strata::testing::throws_with([] { amp::GradScaler s({.growth_factor = 0.5}); }, {"growth_factor"}));
  EXPECT_TRUE(strata::testing::throws_with([] { amp::GradScaler s({.backoff_factor = 1}); }, {"backoff_factor"}));
  EXPECT_TRUE(strata::testing::throws_with([] { amp::GradScaler s({.growth_interval = 0}); }, {"growth_interval"}));
  EXPECT_TRUE(strata::testing::throws_with([&] { scaler.update(0.0); }, {"new_scale"}));
}

TEST(GradScaler, StepWithoutUnscaleUnscalesAndUnscaleBeforeClippingIsNotRepeated) {
  const Tensor p = tensor({1.0, 2.0}).requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  amp::GradScaler scaler({.init_scale = 8});
  scaler.scale(sum(p * tensor({3.0, 4.0}))).backward();
  EXPECT_EQ(values(p.grad()), (std::vector<double>{24, 32}));
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(values(p), (std::vector<double>{-2, -2}));
  scaler.update();
  opt.zero_grad();
  scaler.scale(sum(p * tensor({3.0, 4.0}))).backward();
  scaler.unscale_(opt);
  optim::clip_grad_norm_({p}, 1.0);  // clips the true gradient (3, 4) to unit norm
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(strata::testing::all_close(p, {-2.6, -2.8}, 1e-6, 1e-6));
}

TEST(GradScaler, DisabledScalerPassesThrough) {
  const Tensor p = full({2}, 1.0).requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  amp::GradScaler scaler({.enabled = false});
  EXPECT_FALSE(scaler.is_enabled());
  const Tensor loss = sum(p * tensor({kInf, 1.0}));
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale_(opt);
  scaler.unscale_(opt);  // no stages when disabled
  EXPECT_TRUE(scaler.step(opt));  // steps even on an inf: a disabled scaler checks nothing
  EXPECT_TRUE(std::isinf(values(p)[0]));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().scalars.empty());
  scaler.load_state_dict({"GradScaler", {}, {{"scale", 4.0}}});
  EXPECT_EQ(scaler.get_scale(), 1.0);
  // an enabled scaler refuses a disabled one's state
  amp::GradScaler enabled;
  EXPECT_TRUE(strata::testing::throws_with([&] { enabled.load_state_dict(scaler.state_dict()); },
                                           {"[GradScaler]", "disabled"}));
}

TEST(GradScaler, StateDictRoundTrip) {
  const Tensor p = full({2}, 1.0).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  amp::GradScaler a({.init_scale = 256, .growth_factor = 4, .backoff_factor = 0.125, .growth_interval = 5});
  for (int s = 0; s < 7; ++s) {
    opt.zero_grad();
    a.scale(sum(p * (s == 5 ? kInf : 1.0))).backward();
    a.step(opt);
    a.update();
  }
  optim::StateDict d = a.state_dict();
  EXPECT_EQ(d.type, "GradScaler");
  EXPECT_EQ(d.scalars.at("scale"), a.get_scale());
  EXPECT_EQ(d.scalars.at("growth_factor"), 4.0);
  EXPECT_EQ(d.scalars.at("backoff_factor"), 0.125);
  EXPECT_EQ(d.scalars.at("growth_interval"), 5.0);
  EXPECT_EQ(d.scalars.at("_growth_tracker"), 1.0);
  amp::GradScaler b;
  b.load_state_dict(d);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.options().growth_interval, 5);
  // bad dicts raise and change nothing
  for (const char* key : {"scale", "_growth_tracker", "growth_interval"}) {
    optim::StateDict bad = d;
    bad.scalars.erase(key);
    EXPECT_TRUE(strata::testing::throws_with([&] { b.load_state_dict(bad); }, {"[GradScaler]", key}));
  }
  optim::StateDict bad = d;
  bad.scalars["scale"] = -1;
  EXPECT_TRUE(strata::testing::throws_with([&] { b.load_state_dict(bad); }, {"init_scale"}));
  bad = d;
  bad.scalars["_growth_tracker"] = 1.5;
  EXPECT_TRUE(strata::testing::throws_with([&] { b.load_state_dict(bad); }, {"_growth_tracker", "integer"}));
  bad = d;
  bad.type = "AdamW";
  EXPECT_TRUE(strata::testing::throws_with([&] { b.load_state_dict(bad); }, {"AdamW"}));
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), 1);
}

namespace {

// A small float16-style run: an MLP under bfloat16 autocast with a scaler whose small growth
// interval makes the scale move, and an inf injected into the loss every 4th step.
struct ScaledRun {
  Generator init, data;
  nn::Sequential model;
  optim::AdamW opt;
  amp::GradScaler scaler;

  explicit ScaledRun(uint64_t seed, double init_scale = 1024)
      : init(seed),
        data(7),
        model(nn::Linear(6, 16, {.generator = &init}), nn::ReLU(), nn::Linear(16, 3, {.generator = &init})),
        opt(model.parameters(), {.lr = 1e-2}),
        scaler({.init_scale = init_scale, .growth_interval = 2}) {}

  io::TrainingState state() {
    return {.model = &model, .optimizer = &opt, .scaler = io::stateful(scaler), .generators = {{"data", &data}}};
  }

  uint32_t step(int s) {
    const Tensor x = randn({8, 6}, kFloat32, &data), y = randint(0, 3, {8}, kInt64, &data);
    Tensor loss;
    {
      amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
      loss = F::cross_entropy(model(x), y);
    }
    opt.zero_grad();
    scaler.scale(s % 4 == 3 ? loss * kInf : loss).backward();
    scaler.step(opt);
    scaler.update();
    const float v = loss.item<float>();
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return bits;
  }
};

}  // namespace

TEST(GradScaler, CheckpointResumesBitExactly) {
  constexpr int kSteps = 12, kSplit = 5;
  std::vector<uint32_t> want;
  std::vector<double> scales;
  std::vector<std::vector<double>> final_params;
  {
    ScaledRun run(11);
    for (int s = 0; s < kSteps; ++s) {
      want.push_back(run.step(s));
      scales.push_back(run.scaler.get_scale());
    }
    for (const Tensor& p : run.model.parameters()) final_params.push_back(values(p));
  }
  strata::testing::TempDir dir{"strata_amp"};
  const std::string path = dir / "run.safetensors";
  {
    ScaledRun run(11);
    for (int s = 0; s < kSplit; ++s) ASSERT_EQ(run.step(s), want[s]);
    io::save_checkpoint(path, run.state(), {.step = kSplit});
  }
  // fresh objects with other weights and another scale, as in a new process
  ScaledRun resumed(99, 4);
  auto state = resumed.state();
  const io::Checkpoint ck = io::load_checkpoint(path, state);
  ASSERT_EQ(ck.step, kSplit);
  EXPECT_EQ(resumed.scaler.get_scale(), scales[kSplit - 1]);
  for (int s = kSplit; s < kSteps; ++s) {
    EXPECT_EQ(resumed.step(s), want[s]) << "step " << s;
    EXPECT_EQ(resumed.scaler.get_scale(), scales[s]) << "step " << s;
  }
  const std::vector<Tensor> params = resumed.model.parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(values(params[i]), final_params[i]) << i;
  const io::CheckpointFile f = io::read_checkpoint(path);
  ASSERT_TRUE(f.has_scaler);
  EXPECT_EQ(f.scaler.type, "GradScaler");
  EXPECT_EQ(f.scaler.scalars.at("scale"), scales[kSplit - 1]);
}

// An MLP trained on a fixed regression batch: bfloat16 autocast with a scaler lowers the loss as
// the float32 run does; the losses agree within 1% of the first loss at every step.
TEST(GradScaler, MlpUnderBf16AutocastTracksFloat32) {
  Generator g(21);
  const Tensor x = randn({32, 8}, kFloat32, &g), target = tanh(matmul(x, randn({8, 4}, kFloat32, &g)));
  auto train = [&](bool amp_on) {
    Generator init(5);
    nn::Sequential model(nn::Linear(8, 32, {.generator = &init}), nn::Tanh(), nn::Linear(32, 4, {.generator = &init}));
    optim::Adam opt(model.parameters(), {.lr = 1e-2});
    amp::GradScaler scaler({.enabled = amp_on});
    std::vector<double> losses;
    for (int s = 0; s < 30; ++s) {
      Tensor loss;
      {
        amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16, amp_on);
        const Tensor out = model(x);
        EXPECT_EQ(out.dtype(), amp_on ? kBFloat16 : kFloat32);
        loss = F::mse_loss(out, target);
      }
      EXPECT_EQ(loss.dtype(), kFloat32);
      opt.zero_grad();
      scaler.scale(loss).backward();
      for (const Tensor& p : model.parameters()) EXPECT_EQ(p.grad().dtype(), kFloat32);
      scaler.step(opt);
      scaler.update();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const std::vector<double> fp32 = train(false), mixed = train(true);
  EXPECT_LT(mixed.back(), 0.5 * mixed.front());
  EXPECT_LT(fp32.back(), 0.5 * fp32.front());
  double worst = 0;
  for (size_t s = 0; s < fp32.size(); ++s) worst = std::max(worst, std::fabs(mixed[s] - fp32[s]) / fp32.front());
  std::printf("largest loss difference: %.4f of the first loss; final %.4f (fp32 %.4f) from %.4f\n", worst,
              mixed.back(), fp32.back(), fp32.front());
  EXPECT_LT(worst, 0.01);
}
