// ConstantLR, MultiplicativeLR, PolynomialLR, CosineAnnealingWarmRestarts and CyclicLR step by
// step against their closed forms (PyTorch's docs and CyclicLR's get_lr, written here
// independently), state dict resume, and bad arguments.
#include <cmath>
#include <numbers>

#include "optim/scheduler_testing.h"

namespace strata {
namespace {

using testing::expect_schedule;
using testing::Fixture;
constexpr double kPi = std::numbers::pi;
const double kBase[2] = {0.05, 0.2};

TEST(SchedulerMore, ConstantLR) {
  Fixture f;
  optim::ConstantLR s(*f.opt, 0.5, 4);
  expect_schedule(s, *f.opt, 10, [](int64_t e, size_t g, double) { return kBase[g] * (e < 4 ? 0.5 : 1.0); });
  EXPECT_TRUE(testing::throws_with([&] { optim::ConstantLR(*f.opt, 1.5); }, {"factor"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::ConstantLR(*f.opt, 0.5, -1); }, {"total_iters"}));
}

TEST(SchedulerMore, MultiplicativeLRIsPyTorchsRecursion) {
  Fixture f;
  optim::MultiplicativeLR s(*f.opt, [](int64_t e) { return e % 3 == 0 ? 0.5 : 0.95; });
  expect_schedule(s, *f.opt, 30, [](int64_t e, size_t, double lr) {  // lr *= lambda(epoch) for epoch > 0
    return e == 0 ? lr : lr * (e % 3 == 0 ? 0.5 : 0.95);
  });
  Fixture h;
  optim::MultiplicativeLR bad(*h.opt, [](int64_t e) { return e == 3 ? -1.0 : 1.0; });
  bad.step(), bad.step();
  EXPECT_TRUE(testing::throws_with([&] { bad.step(); }, {"param group 0", "step 3"}));
  EXPECT_EQ(h.opt->lr(0), 0.05);  // nothing changed

  // loaded back to an earlier step, the product starts again from there
  Fixture a, b;
  auto factor = [](int64_t e) { return 1.0 - 0.01 * static_cast<double>(e % 7); };
  optim::MultiplicativeLR early(*a.opt, factor), late(*b.opt, factor);
  for (int i = 0; i < 5; ++i) early.step();
  for (int i = 0; i < 12; ++i) late.step();
  late.load_state_dict(early.state_dict());
  early.step(), late.step();
  double expected = kBase[1];
  for (int64_t e = 1; e <= 6; ++e) expected *= factor(e);
  EXPECT_DOUBLE_EQ(b.opt->lr(1), expected);
  EXPECT_EQ(b.opt->lr(1), a.opt->lr(1));
}

TEST(SchedulerMore, PolynomialLR) {
  Fixture f;
  optim::PolynomialLR s(*f.opt, 6, 2.0);
  expect_schedule(s, *f.opt, 10, [](int64_t e, size_t g, double) {
    const double t = static_cast<double>(std::min<int64_t>(e, 6));
    return kBase[g] * (1 - t / 6) * (1 - t / 6);
  });
  EXPECT_EQ(f.opt->lr(0), 0.0);
  EXPECT_TRUE(testing::throws_with([&] { optim::PolynomialLR(*f.opt, 0); }, {"total_iters"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::PolynomialLR(*f.opt, 5, -1); }, {"power"}));
}

TEST(SchedulerMore, CosineAnnealingWarmRestarts) {
  Fixture f;
  optim::CosineAnnealingWarmRestarts s(*f.opt, 3, 2, 0.001);
  // periods 3, 6, 12, ...: restarts at steps 3, 9, 21
  expect_schedule(s, *f.opt, 40, [](int64_t e, size_t g, double) {
    double t_cur = static_cast<double>(e), t_i = 3;
    while (t_cur >= t_i) t_cur -= t_i, t_i *= 2;
    return 0.001 + (kBase[g] - 0.001) * (1 + std::cos(kPi * t_cur / t_i)) / 2;
  });
  Fixture h;
  optim::CosineAnnealingWarmRestarts same(*h.opt, 5);
  expect_schedule(same, *h.opt, 23, [](int64_t e, size_t g, double) {
    return kBase[g] * (1 + std::cos(kPi * static_cast<double>(e % 5) / 5)) / 2;
  });
  EXPECT_TRUE(testing::throws_with([&] { optim::CosineAnnealingWarmRestarts(*h.opt, 0); }, {"T_0"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::CosineAnnealingWarmRestarts(*h.opt, 5, 0); }, {"T_mult"}));
}

// A T_mult so large that the second period's length does not fit in int64: the first restart
// still comes at T_0, then the (practically endless) second period anneals from base_lr.
TEST(SchedulerMore, CosineAnnealingWarmRestartsHugeTMult) {
  Fixture f;
  optim::CosineAnnealingWarmRestarts s(*f.opt, 4, int64_t{1} << 62);
  expect_schedule(s, *f.opt, 8, [](int64_t e, size_t g, double) {
    if (e < 4) return kBase[g] * (1 + std::cos(kPi * static_cast<double>(e) / 4)) / 2;
    return kBase[g] * (1 + std::cos(kPi * static_cast<double>(e - 4) / std::ldexp(1.0, 64))) / 2;
  });
}

// PyTorch's CyclicLR.get_lr, with its scale functions
double cyclic(int64_t e, double lo, double hi, double up, double down, optim::CyclicLROptions::Mode mode,
              double gamma) {
  const double total = up + down, ratio = up / total, ep = static_cast<double>(e);
  const double cycle = std::floor(1 + ep / total), x = 1 + ep / total - cycle;
  const double factor = x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
  double scale = 1;
  if (mode == optim::CyclicLROptions::Mode::Triangular2) scale = 1 / std::pow(2.0, cycle - 1);
  if (mode == optim::CyclicLROptions::Mode::ExpRange) scale = std::pow(gamma, ep);
  return lo + (hi - lo) * factor * scale;
}

TEST(SchedulerMore, CyclicLRModesAndMomentum) {
  using Mode = optim::CyclicLROptions::Mode;
  for (Mode mode : {Mode::Triangular, Mode::Triangular2, Mode::ExpRange}) {
    Fixture f;
    optim::CyclicLR s(*f.opt, {0.01, 0.02}, {0.1, 0.3},
                      {.step_size_up = 4, .step_size_down = 6, .mode = mode, .gamma = 0.97});
    const double lo[2] = {0.01, 0.02}, hi[2] = {0.1, 0.3};
    expect_schedule(s, *f.opt, 35, [&](int64_t e, size_t g, double) {
      EXPECT_NEAR(f.opt->momentum(g), 0.9 - (cyclic(e, 0.8, 0.9, 4, 6, mode, 0.97) - 0.8), 1e-12) << e;
      return cyclic(e, lo[g], hi[g], 4, 6, mode, 0.97);
    });
  }
  // a custom scale of the step (scale_mode iterations); momentum left alone
  Fixture h;
  optim::CyclicLR c(*h.opt, 0.01, 0.1,
                    {.step_size_up = 3,
                     .scale_fn = [](double x) { return 1 / (1 + x); },
                     .scale_mode = optim::CyclicLROptions::ScaleMode::Iterations,
                     .cycle_momentum = false});
  for (int64_t e = 1; e < 20; ++e) {
    c.step();
    const double plain = cyclic(e, 0.01, 0.1, 3, 3, Mode::Triangular, 1);
    EXPECT_NEAR(h.opt->lr(0), 0.01 + (plain - 0.01) / (1 + static_cast<double>(e)), 1e-15);
    EXPECT_EQ(h.opt->momentum(0), 0.9);
  }
  optim::Adagrad no_momentum({h.a}, {});
  EXPECT_TRUE(testing::throws_with([&] { optim::CyclicLR(no_momentum, 0.01, 0.1); }, {"cycle_momentum"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::CyclicLR(*h.opt, 0.01, 0.1, {.step_size_up = 0}); },
                                   {"step_size_up"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::CyclicLR(*h.opt, -0.01, 0.1); }, {"base_lr"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::CyclicLR(*h.opt, 0.01, 0.1, {.max_momentum = 1.0}); },
                                   {"max_momentum"}));
}

// stepped 13 times, saved, loaded into a fresh scheduler on a fresh optimizer: the next steps agree
template <class Make>
void expect_resume(Make make) {
  Fixture f, g(1.0, 1.0);
  auto s = make(f);
  for (int i = 0; i < 13; ++i) s->step();
  auto r = make(g);
  r->load_state_dict(s->state_dict());
  for (int i = 0; i < 10; ++i) {
    s->step(), r->step();
    EXPECT_EQ(r->get_last_lr(), s->get_last_lr()) << s->name();
    EXPECT_EQ(g.opt->momentum(1), f.opt->momentum(1)) << s->name();
  }
}

TEST(SchedulerMore, StateDictResume) {
  expect_resume([](Fixture& f) { return std::make_unique<optim::ConstantLR>(*f.opt, 0.5, 15); });
  expect_resume([](Fixture& f) {
    return std::make_unique<optim::MultiplicativeLR>(*f.opt, [](int64_t) { return 0.9; });
  });
  expect_resume([](Fixture& f) { return std::make_unique<optim::PolynomialLR>(*f.opt, 20, 1.5); });
  expect_resume([](Fixture& f) { return std::make_unique<optim::CosineAnnealingWarmRestarts>(*f.opt, 4, 2); });
  expect_resume([](Fixture& f) {
    return std::make_unique<optim::CyclicLR>(*f.opt, 0.01, 0.1,
                                             optim::CyclicLROptions{.step_size_up = 5, .mode =
                                                                        optim::CyclicLROptions::Mode::Triangular2});
  });
}

}  // namespace
}  // namespace strata
