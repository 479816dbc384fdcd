// LR schedulers against PyTorch's formulas, written here independently: the closed forms of
// the docs, and for the schedules PyTorch steps recursively (StepLR, MultiStepLR,
// ExponentialLR, CosineAnnealingLR, LinearLR) its recursive form too; OneCycleLR as its
// get_lr() computes phases; SequentialLR as its step() switches schedulers;
// ReduceLROnPlateau on hand-worked metric sequences. Plus state dict round trips and bad input.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>

#include "optim/scheduler_testing.h"

namespace strata {
namespace {

using optim::LRScheduler;
constexpr double kPi = std::numbers::pi;
constexpr double kInf = std::numeric_limits<double>::infinity();

using testing::expect_schedule;
using testing::Fixture;

TEST(Scheduler, StepLR) {
  Fixture f;
  optim::StepLR s(*f.opt, 30, 0.1);
  const double base[2] = {0.05, 0.2};
  expect_schedule(s, *f.opt, 100, [&](int64_t e, size_t g, double) { return base[g] * std::pow(0.1, e / 30); });
  Fixture f2;
  optim::StepLR s2(*f2.opt, 7, 0.5);
  expect_schedule(s2, *f2.opt, 40, [](int64_t e, size_t, double lr) {  // PyTorch's recursive get_lr
    return (e == 0 || e % 7 != 0) ? lr : lr * 0.5;
  });
}

TEST(Scheduler, MultiStepLR) {
  Fixture f;
  optim::MultiStepLR s(*f.opt, {30, 80}, 0.1);
  const double base[2] = {0.05, 0.2};
  expect_schedule(s, *f.opt, 100, [&](int64_t e, size_t g, double) {
    return base[g] * (e < 30 ? 1 : e < 80 ? 0.1 : 0.01);
  });
  Fixture f2;
  optim::MultiStepLR s2(*f2.opt, {3, 5, 5, 9}, 0.5);  // a repeated milestone applies twice
  expect_schedule(s2, *f2.opt, 12, [](int64_t e, size_t, double lr) {
    int hits = (e == 3) + 2 * (e == 5) + (e == 9);
    return lr * std::pow(0.5, hits);
  });
}

TEST(Scheduler, ExponentialLR) {
  Fixture f;
  optim::ExponentialLR s(*f.opt, 0.9);
  expect_schedule(s, *f.opt, 60, [](int64_t e, size_t, double lr) { return e == 0 ? lr : lr * 0.9; });
}

TEST(Scheduler, CosineAnnealingLR) {
  const int64_t T = 10;
  const double eta = 0.001;
  Fixture f;
  optim::CosineAnnealingLR s(*f.opt, T, eta);
  const double base[2] = {0.05, 0.2};
  expect_schedule(s, *f.opt, 35, [&](int64_t e, size_t g, double lr) {
    // PyTorch's recursive form, periodic past T_max
    if (e == 0) return lr;
    if ((e - 1 - T) % (2 * T) == 0) return lr + (base[g] - eta) * (1 - std::cos(kPi / T)) / 2;
    return (1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * (e - 1) / T)) * (lr - eta) + eta;
  }, 1e-9);
  EXPECT_NEAR(s.lr_at(T, 0), eta, 1e-15);
  EXPECT_NEAR(s.lr_at(T / 2, 1), eta + (0.2 - eta) / 2, 1e-15);
}

TEST(Scheduler, LinearLR) {
  Fixture f;
  optim::LinearLR s(*f.opt, 0.25, 1.0, 8);
  expect_schedule(s, *f.opt, 15, [](int64_t e, size_t, double lr) {
    if (e == 0) return lr * 0.25;
    if (e > 8) return lr;
    return lr * (1 + 0.75 / (8 * 0.25 + (e - 1) * 0.75));
  });
}

TEST(Scheduler, LambdaLRPerGroup) {
  Fixture f;
  optim::LambdaLR s(*f.opt, std::vector<optim::LambdaLR::Lambda>{[](int64_t e) { return 1.0 / (1 + e); },
                                                                  [](int64_t e) { return std::pow(0.95, e); }});
  const double base[2] = {0.05, 0.2};
  expect_schedule(s, *f.opt, 20, [&](int64_t e, size_t g, double) {
    return g == 0 ? base[0] / (1 + e) : base[1] * std::pow(0.95, e);
  });
  EXPECT_THROW(optim::LambdaLR(*f.opt, std::vector<optim::LambdaLR::Lambda>{[](int64_t) { return 1.0; }}), Error);
}

TEST(Scheduler, WarmupFamily) {
  const double base[2] = {0.05, 0.2};
  // Hugging Face's schedule lambdas, with the floor min_lr added: lr = min + (base - min) * f
  {
    Fixture f;
    optim::WarmupCosine s(*f.opt, 10, 50, 0.001);
    expect_schedule(s, *f.opt, 60, [&](int64_t e, size_t g, double) {
      if (e < 10) return base[g] * e / 10.0;
      double prog = std::min(1.0, (e - 10) / 40.0);
      return 0.001 + (base[g] - 0.001) * 0.5 * (1 + std::cos(kPi * prog));
    });
  }
  {
    Fixture f;
    optim::WarmupLinear s(*f.opt, 5, 25);
    expect_schedule(s, *f.opt, 30, [&](int64_t e, size_t g, double) {
      if (e < 5) return base[g] * e / 5.0;
      return base[g] * std::max(0.0, (25.0 - e) / 20.0);
    });
  }
  {
    Fixture f;
    optim::LinearWarmup s(*f.opt, 4);
    expect_schedule(s, *f.opt, 10, [&](int64_t e, size_t g, double) { return base[g] * std::min(1.0, e / 4.0); });
  }
}

// torch.optim.lr_scheduler.OneCycleLR.get_lr, transcribed, in float64, with two departures:
// a zero-length phase is at its end (PyTorch divides by zero) and step total_steps keeps the
// final values (PyTorch extrapolates, to a negative lr with linear annealing).
double onecycle_ref(int64_t step, double max_lr, int64_t total, const optim::OneCycleOptions& o, bool momentum) {
  const double initial = max_lr / o.div_factor, min_lr = initial / o.final_div_factor;
  struct P { double end, slr, elr, sm, em; };
  std::vector<P> phases;
  if (o.three_phase)
    phases = {{o.pct_start * total - 1, initial, max_lr, o.max_momentum, o.base_momentum},
              {2 * o.pct_start * total - 2, max_lr, initial, o.base_momentum, o.max_momentum},
              {total - 1.0, initial, min_lr, o.max_momentum, o.max_momentum}};
  else
    phases = {{o.pct_start * total - 1, initial, max_lr, o.max_momentum, o.base_momentum},
              {total - 1.0, max_lr, min_lr, o.base_momentum, o.max_momentum}};
  auto anneal = [&](double s, double e, double pct) {
    return o.anneal_strategy == optim::OneCycleOptions::Anneal::Cos ? e + (s - e) / 2.0 * (std::cos(kPi * pct) + 1)
                                                                     : (e - s) * pct + s;
  };
  double start = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (step <= phases[i].end || i + 1 == phases.size()) {
      const double len = phases[i].end - start;
      const double pct = len == 0 ? 1 : std::min(1.0, (step - start) / len);
      return momentum ? anneal(phases[i].sm, phases[i].em, pct) : anneal(phases[i].slr, phases[i].elr, pct);
    }
    start = phases[i].end;
  }
  return 0;
}

TEST(Scheduler, OneCycleLR) {
  for (bool three : {false, true}) {
    for (auto anneal : {optim::OneCycleOptions::Anneal::Cos, optim::OneCycleOptions::Anneal::Linear}) {
      optim::OneCycleOptions o{.anneal_strategy = anneal, .three_phase = three};
      Fixture f;
      optim::OneCycleLR s(*f.opt, std::vector<double>{0.1, 0.4}, 100, o);
      const double max_lr[2] = {0.1, 0.4};
      expect_schedule(s, *f.opt, 101, [&](int64_t e, size_t g, double) {
        EXPECT_NEAR(f.opt->momentum(g), onecycle_ref(e, max_lr[g], 100, o, true), 1e-12);
        return onecycle_ref(e, max_lr[g], 100, o, false);
      });
      EXPECT_THROW(s.step(), Error);  // past total_steps
    }
  }
  // the Adam family cycles beta1
  Tensor a = ones({2});
  a.requires_grad_();
  optim::AdamW adamw({a});
  optim::OneCycleLR s(adamw, 0.01, 10);
  EXPECT_EQ(adamw.param_groups()[0].options.betas[0], 0.95);
  EXPECT_NEAR(adamw.lr(0), 0.01 / 25, 1e-17);  // annealed to the start, as PyTorch does
  optim::Adagrad adagrad({a});
  EXPECT_THROW(optim::OneCycleLR(adagrad, 0.01, 10), Error);
  optim::OneCycleLR no_momentum(adagrad, 0.01, 10, {.cycle_momentum = false});
  EXPECT_THROW(optim::OneCycleLR(adamw, 0.01, 0), Error);
  EXPECT_THROW(optim::OneCycleLR(adamw, 0.01, 10, {.pct_start = 1.5}), Error);
  // a position past the schedule (a dict from a longer one) is refused on load, not at the
  // next step; the schedule's own end loads
  optim::OneCycleLR longer(no_momentum.optimizer(), 0.01, 500, {.cycle_momentum = false});
  for (int i = 0; i < 20; ++i) longer.step();
  EXPECT_TRUE(strata::testing::throws_with([&] { no_momentum.load_state_dict(longer.state_dict()); },
                                           {"[OneCycleLR]", "past the schedule"}));
  EXPECT_EQ(no_momentum.last_epoch(), 0);
  optim::OneCycleLR same(adagrad, 0.01, 10, {.cycle_momentum = false});
  for (int i = 0; i < 10; ++i) same.step();
  no_momentum.load_state_dict(same.state_dict());
  EXPECT_EQ(no_momentum.last_epoch(), 10);
}

// pct_start * total_steps == 1 gives a warm-up phase of zero length (and three_phase a second
// one): the lr starts at max_lr, and lr and momentum stay finite to the end.
TEST(Scheduler, OneCycleLRZeroLengthPhases) {
  struct Case {
    double pct_start;
    int64_t total;
    bool three;
  };
  for (Case c : {Case{0.01, 100, false}, Case{0.01, 100, true}, Case{1.0, 1, false}, Case{0.5, 2, true},
                 Case{0.02, 50, true}}) {
    for (auto anneal : {optim::OneCycleOptions::Anneal::Cos, optim::OneCycleOptions::Anneal::Linear}) {
      SCOPED_TRACE(fmt::format("pct_start {} total {} three_phase {}", c.pct_start, c.total, c.three));
      optim::OneCycleOptions o{.pct_start = c.pct_start, .anneal_strategy = anneal, .three_phase = c.three};
      Fixture f;
      optim::OneCycleLR s(*f.opt, std::vector<double>{0.1, 0.4}, c.total, o);
      EXPECT_NEAR(f.opt->lr(0), 0.1, 1e-16);  // the zero-length warm-up is over at once
      EXPECT_NEAR(f.opt->momentum(1), o.base_momentum, 1e-15);
      const double max_lr[2] = {0.1, 0.4};
      expect_schedule(s, *f.opt, static_cast<int>(c.total) + 1, [&](int64_t e, size_t g, double) {
        EXPECT_NEAR(f.opt->momentum(g), onecycle_ref(e, max_lr[g], c.total, o, true), 1e-12) << e;
        return onecycle_ref(e, max_lr[g], c.total, o, false);
      });
      EXPECT_NEAR(f.opt->lr(1), 0.4 / o.div_factor / o.final_div_factor, 1e-15);  // min_lr at the end
      EXPECT_THROW(s.step(), Error);
    }
  }
  // the case that set a NaN lr: the optimizer can step under it
  Tensor p = ones({2});
  p.requires_grad_();
  optim::SGD o({p}, {.momentum = 0.9});
  optim::OneCycleLR s(o, 0.1, 100, {.pct_start = 0.01});
  EXPECT_EQ(o.lr(0), 0.1);  // cosine annealing reaches its end value exactly
  EXPECT_EQ(o.momentum(0), 0.85);
  p.set_grad(ones({2}));
  o.step();
  s.step();
  EXPECT_TRUE(testing::all_close(p, {0.9, 0.9}, 1e-7, 0));
}

TEST(Scheduler, SequentialLR) {
  Fixture f;
  auto warm = std::make_shared<optim::LinearLR>(*f.opt, 0.5, 1.0, 4);
  auto decay = std::make_shared<optim::ExponentialLR>(*f.opt, 0.9);
  optim::SequentialLR s(*f.opt, {warm, decay}, {5});
  const double base[2] = {0.05, 0.2};
  expect_schedule(s, *f.opt, 15, [&](int64_t e, size_t g, double) {
    if (e < 5) return base[g] * (0.5 + 0.5 * std::min<int64_t>(e, 4) / 4.0);
    return base[g] * std::pow(0.9, e - 5);
  });
  // nested: warmup, then (cosine, then constant-at-floor via StepLR gamma 1)
  Fixture h;
  auto w = std::make_shared<optim::LinearWarmup>(*h.opt, 3);
  auto c = std::make_shared<optim::CosineAnnealingLR>(*h.opt, 6, 0.01);
  auto flat = std::make_shared<optim::StepLR>(*h.opt, 1, 1.0);
  auto tail = std::make_shared<optim::SequentialLR>(*h.opt, std::vector<std::shared_ptr<LRScheduler>>{c, flat},
                                                    std::vector<int64_t>{6});
  optim::SequentialLR nested(*h.opt, {w, tail}, {3});
  expect_schedule(nested, *h.opt, 14, [&](int64_t e, size_t g, double) {
    if (e < 3) return base[g] * e / 3.0;
    if (e < 9) return 0.01 + (base[g] - 0.01) * (1 + std::cos(kPi * (e - 3) / 6.0)) / 2;
    return base[g];
  });
  EXPECT_THROW(optim::SequentialLR(*f.opt, {warm, decay}, {}), Error);
  EXPECT_THROW(optim::SequentialLR(*f.opt, {warm, decay}, {5, 6}), Error);
  EXPECT_THROW(optim::SequentialLR(*f.opt, {warm, decay, decay}, {6, 5}), Error);
  Fixture other;
  EXPECT_THROW(optim::SequentialLR(*other.opt, {warm, decay}, {5}), Error);
}

// A SequentialLR's state dict carries its children's, whose base lrs give the lrs: resumed on
// an optimizer built with other lrs it goes on as the saved run (it had used the new lrs).
TEST(Scheduler, SequentialLRStateDictCarriesItsChildren) {
  auto make = [](Fixture& f) {
    auto warm = std::make_shared<optim::LinearLR>(*f.opt, 0.5, 1.0, 4);
    auto decay = std::make_shared<optim::ExponentialLR>(*f.opt, 0.9);
    return std::make_unique<optim::SequentialLR>(*f.opt, std::vector<std::shared_ptr<LRScheduler>>{warm, decay},
                                                 std::vector<int64_t>{5});
  };
  Fixture f;  // lrs 0.05 and 0.2
  auto s = make(f);
  for (int i = 0; i < 7; ++i) s->step();
  const optim::StateDict d = s->state_dict();
  Fixture g(1.0, 1.0);
  auto r = make(g);
  r->load_state_dict(d);
  s->step();
  r->step();
  EXPECT_NEAR(g.opt->lr(0), 0.05 * std::pow(0.9, 3), 1e-15);
  EXPECT_NEAR(g.opt->lr(1), 0.2 * std::pow(0.9, 3), 1e-15);
  EXPECT_EQ(r->get_last_lr(), s->get_last_lr());
  // a child's state that does not fit is refused, and nothing changes
  optim::StateDict bad = d;
  bad.scalars["scheduler.1.last_epoch"] = 0.5;
  Fixture h(1.0, 1.0);
  auto t = make(h);
  const optim::StateDict before = t->state_dict();
  EXPECT_THROW(t->load_state_dict(bad), Error);
  EXPECT_EQ(t->state_dict().scalars, before.scalars);
}

// PyTorch's chaining example, ExponentialLR(0.9) with MultiStepLR({3, 6}, 0.1), in PyTorch's
// recursive form: every step multiplies the lr by 0.9, and a milestone by 0.1 more.
TEST(Scheduler, ChainedScheduler) {
  Fixture f;
  auto expo = std::make_shared<optim::ExponentialLR>(*f.opt, 0.9);
  auto steps = std::make_shared<optim::MultiStepLR>(*f.opt, std::vector<int64_t>{3, 6}, 0.1);
  optim::ChainedScheduler s(*f.opt, {expo, steps});
  expect_schedule(s, *f.opt, 12, [](int64_t e, size_t, double lr) {
    return e == 0 ? lr : lr * 0.9 * (e == 3 || e == 6 ? 0.1 : 1.0);
  });
  EXPECT_EQ(expo->last_epoch(), 11);  // the children follow

  // A child's other effects (OneCycleLR's momentum) still apply: the lr is the lone
  // OneCycleLR's times 0.95^e, and the momentum is the lone one's.
  Fixture g, lone;
  auto cycle = std::make_shared<optim::OneCycleLR>(*g.opt, std::vector<double>{0.1, 0.4}, 20);
  auto decay = std::make_shared<optim::ExponentialLR>(*g.opt, 0.95);
  optim::ChainedScheduler chained(*g.opt, {cycle, decay});
  optim::OneCycleLR reference(*lone.opt, std::vector<double>{0.1, 0.4}, 20);
  for (int e = 0; e <= 20; ++e) {
    if (e > 0) chained.step(), reference.step();
    for (size_t group = 0; group < 2; ++group) {
      const double want = lone.opt->lr(group) * std::pow(0.95, e);
      ASSERT_NEAR(g.opt->lr(group), want, 1e-12 * want) << "step " << e;
      ASSERT_EQ(g.opt->momentum(group), lone.opt->momentum(group)) << "step " << e;
    }
  }

  // the state dict carries the children's, as SequentialLR's does
  Fixture h, r(1.0, 1.0);
  auto make = [](Fixture& fx) {
    auto a = std::make_shared<optim::ExponentialLR>(*fx.opt, 0.9);
    auto b = std::make_shared<optim::StepLR>(*fx.opt, 4, 0.5);
    return std::make_unique<optim::ChainedScheduler>(*fx.opt, std::vector<std::shared_ptr<LRScheduler>>{a, b});
  };
  auto run = make(h), resumed = make(r);
  for (int i = 0; i < 6; ++i) run->step();
  resumed->load_state_dict(run->state_dict());
  run->step(), resumed->step();
  EXPECT_NEAR(r.opt->lr(1), 0.2 * std::pow(0.9, 7) * 0.5, 1e-15);
  EXPECT_EQ(resumed->get_last_lr(), run->get_last_lr());
  EXPECT_THROW(optim::ChainedScheduler(*f.opt, {}), Error);
  EXPECT_THROW(optim::ChainedScheduler(*f.opt, {expo, nullptr}), Error);
  EXPECT_THROW(optim::ChainedScheduler(*g.opt, {expo}), Error);  // another optimizer's
}

// Two schedulers stepped in turn on one optimizer would each overwrite the other's lr: the
// second round raises, naming the way to compose them. One that replaces another is fine.
TEST(Scheduler, TwoSchedulersSteppedInTurnRaise) {
  Fixture f;
  optim::ExponentialLR expo(*f.opt, 0.9);
  optim::MultiStepLR steps(*f.opt, {3, 6}, 0.1);
  expo.step();
  steps.step();
  EXPECT_TRUE(strata::testing::throws_with([&] { expo.step(); }, {"[ExponentialLR]", "ChainedScheduler"}));
  EXPECT_EQ(expo.last_epoch(), 1) << "a refused step changes nothing";

  Fixture g;
  optim::LinearLR warmup(*g.opt, 0.1, 1.0, 3);
  for (int i = 0; i < 3; ++i) warmup.step();
  optim::CosineAnnealingLR cosine(*g.opt, 10);  // takes over; warmup is not stepped again
  for (int i = 0; i < 5; ++i) cosine.step();
  EXPECT_NEAR(g.opt->lr(0), 0.05 * (1 + std::cos(kPi * 5 / 10)) / 2, 1e-15);
}

TEST(Scheduler, InitialLrIsShared) {
  Fixture f;
  optim::StepLR first(*f.opt, 2, 0.5);
  first.step();
  first.step();  // lr is now half the base
  optim::ExponentialLR second(*f.opt, 0.9);  // starts from initial_lr, not from the current lr
  EXPECT_EQ(second.base_lrs()[0], 0.05);
  EXPECT_EQ(f.opt->lr(0), 0.05);
  EXPECT_EQ(f.opt->state_dict().scalars.at("group.1.initial_lr"), 0.2);
}

TEST(Scheduler, StateDictRoundTrip) {
  Fixture f;
  optim::WarmupCosine s(*f.opt, 5, 40, 1e-4);
  for (int i = 0; i < 17; ++i) s.step();
  optim::StateDict d = s.state_dict();
  EXPECT_EQ(d.type, "WarmupCosine");
  Fixture g(1.0, 1.0);  // other lrs: the state dict carries the base lrs
  optim::WarmupCosine t(*g.opt, 5, 40, 1e-4);
  t.load_state_dict(d);
  EXPECT_EQ(t.last_epoch(), 17);
  EXPECT_EQ(t.get_last_lr(), s.get_last_lr());
  for (int i = 0; i < 10; ++i) {
    s.step();
    t.step();
    EXPECT_EQ(t.get_last_lr(), s.get_last_lr());
  }
  optim::StepLR wrong_type(*g.opt, 3);
  EXPECT_THROW(wrong_type.load_state_dict(d), Error);
  Tensor a = ones({1});
  a.requires_grad_();
  optim::SGD one_group({a});
  optim::WarmupCosine fewer(one_group, 5, 40);
  EXPECT_THROW(fewer.load_state_dict(d), Error);
  optim::StateDict broken = d;
  broken.scalars.erase("last_epoch");
  EXPECT_THROW(t.load_state_dict(broken), Error);
  EXPECT_EQ(t.last_epoch(), 27);  // unchanged by the failed load
}

TEST(Scheduler, ReduceLROnPlateau) {
  Fixture f(1.0, 0.5);
  optim::ReduceLROnPlateau s(*f.opt, {.factor = 0.5, .patience = 2, .min_lrs = {0.2, 0.3}});
  // 10, 9 improve; three 9s later (3 bad epochs > patience) both lrs halve, group 1 to its
  // floor 0.3; 8 improves; three 8s: group 0 halves, group 1 stays at its floor; three more:
  // group 0 reaches its floor 0.2
  const std::vector<double> metrics = {10, 9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 8};
  const std::vector<double> want0 = {1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2};
  const std::vector<double> want1 = {.5, .5, .5, .5, .3, .3, .3, .3, .3, .3, .3, .3, .3, .3, .3};
  for (size_t i = 0; i < metrics.size(); ++i) {
    s.step(metrics[i]);
    EXPECT_NEAR(f.opt->lr(0), want0[i], 1e-15) << i;
    EXPECT_NEAR(f.opt->lr(1), want1[i], 1e-15) << i;
  }
  EXPECT_EQ(s.get_last_lr()[0], f.opt->lr(0));
  // mode max, absolute threshold, cooldown 2
  Fixture h(1.0, 1.0);
  optim::ReduceLROnPlateau m(*h.opt, {.mode = optim::ReduceLROnPlateauOptions::Mode::Max, .factor = 0.1, .patience = 0,
                                      .threshold = 0.5, .threshold_mode = optim::ReduceLROnPlateauOptions::ThresholdMode::Abs,
                                      .cooldown = 2});
  // 1: better (best 1); 1.4: not better by 0.5 -> bad 1 > 0: reduce to 0.1, cooldown 2;
  // 1.2: bad, in cooldown (2 -> 1), bad reset; 1.3: bad, cooldown 1 -> 0, reset; 1.1: bad -> reduce 0.01
  const std::vector<double> mm = {1, 1.4, 1.2, 1.3, 1.1, 2.0};
  const std::vector<double> wm = {1, 0.1, 0.1, 0.1, 0.01, 0.01};
  for (size_t i = 0; i < mm.size(); ++i) {
    m.step(mm[i]);
    EXPECT_NEAR(h.opt->lr(0), wm[i], 1e-15) << i;
  }
  EXPECT_EQ(m.best(), 2.0);
  // state round trip
  optim::StateDict d = s.state_dict();
  Fixture k(0.2, 0.3);
  optim::ReduceLROnPlateau r(*k.opt, {.factor = 0.5, .patience = 2, .min_lrs = {0.2, 0.3}});
  r.load_state_dict(d);
  EXPECT_EQ(r.best(), s.best());
  EXPECT_EQ(r.num_bad_epochs(), s.num_bad_epochs());
  EXPECT_EQ(r.last_epoch(), s.last_epoch());
  EXPECT_THROW(r.load_state_dict(optim::StepLR(*k.opt, 2).state_dict()), Error);
  EXPECT_THROW(optim::ReduceLROnPlateau(*k.opt, {.factor = 1.5}), Error);
  EXPECT_THROW(optim::ReduceLROnPlateau(*k.opt, {.min_lrs = {0.1}}), Error);
}

TEST(Scheduler, BadArguments) {
  Fixture f;
  EXPECT_THROW(optim::StepLR(*f.opt, 0), Error);
  EXPECT_THROW(optim::MultiStepLR(*f.opt, {5, 3}), Error);
  EXPECT_THROW(optim::CosineAnnealingLR(*f.opt, 0), Error);
  EXPECT_THROW(optim::LinearLR(*f.opt, 0.0), Error);
  EXPECT_THROW(optim::LinearLR(*f.opt, 0.5, 1.0, 0), Error);
  EXPECT_THROW(optim::WarmupCosine(*f.opt, 10, 10), Error);
  EXPECT_THROW(optim::WarmupLinear(*f.opt, -1, 10), Error);
  EXPECT_THROW(optim::WarmupCosine(*f.opt, 1, 10, -0.1), Error);
  EXPECT_TRUE(testing::throws_with([&] { optim::WarmupCosine(*f.opt, 1, 10, kInf); }, {"min_lr", "inf"}));
  EXPECT_TRUE(
      testing::throws_with([&] { optim::CosineAnnealingLR(*f.opt, 10, -1); }, {"CosineAnnealingLR", "eta_min"}));
  EXPECT_THROW(optim::CosineAnnealingLR(*f.opt, 10, std::nan("")), Error);
  optim::StepLR s(*f.opt, 3);
  f.opt->add_param_group(std::vector<Tensor>{[] {
    Tensor t = ones({1});
    t.requires_grad_();
    return t;
  }()});
  EXPECT_THROW(s.step(), Error);  // built for two groups, the optimizer now has three
}

// Arguments that would give a negative or non-finite lr are refused when the scheduler is
// built, and an lr that still comes out bad (a lambda's factor, an overflow) raises at the step
// that makes it, naming the scheduler and the step, and changes nothing.
TEST(Scheduler, BadLrsAreCaughtByTheScheduler) {
  Fixture f;
  for (double gamma : {-0.5, std::nan(""), kInf}) {
    EXPECT_TRUE(testing::throws_with([&] { optim::StepLR(*f.opt, 3, gamma); }, {"[StepLR] gamma"}));
    EXPECT_TRUE(testing::throws_with([&] { optim::MultiStepLR(*f.opt, {3}, gamma); }, {"[MultiStepLR] gamma"}));
    EXPECT_TRUE(testing::throws_with([&] { optim::ExponentialLR(*f.opt, gamma); }, {"[ExponentialLR] gamma"}));
  }
  for (double max_lr : {-0.1, std::nan(""), kInf})
    EXPECT_TRUE(testing::throws_with([&] { optim::OneCycleLR(*f.opt, max_lr, 10); }, {"[OneCycleLR] max_lr"}));
  EXPECT_THROW(optim::OneCycleLR(*f.opt, std::vector<double>{0.1, -1.0}, 10), Error);
  {
    optim::StepLR zero(*f.opt, 2, 0.0);  // gamma 0 drops the lr to 0, a valid lr
    zero.step();
    zero.step();
    EXPECT_EQ(f.opt->lr(0), 0.0);
  }
  for (double bad : {-1.0, std::nan("")}) {
    Fixture h;
    optim::LambdaLR s(*h.opt, [bad](int64_t e) { return e == 3 ? bad : 1.0 / (1 + e); });
    s.step();
    s.step();
    EXPECT_TRUE(testing::throws_with([&] { s.step(); }, {"[LambdaLR]", "param group 0", "step 3"}));
    EXPECT_EQ(s.last_epoch(), 2);
    EXPECT_EQ(h.opt->lr(0), 0.05 / 3);  // the step-2 lr stays
    EXPECT_EQ(s.get_last_lr()[1], 0.2 / 3);
  }
  // 10^309 overflows to inf
  Fixture h;
  optim::ExponentialLR grow(*h.opt, 10.0);
  for (int e = 1; e < 309; ++e) grow.step();
  EXPECT_TRUE(testing::throws_with([&] { grow.step(); }, {"[ExponentialLR] step 309", "inf"}));
  EXPECT_EQ(grow.last_epoch(), 308);
  EXPECT_TRUE(std::isfinite(h.opt->lr(0)));
}

TEST(Scheduler, LoadRejectsBadLrs) {
  Fixture f;
  optim::StepLR s(*f.opt, 3, 0.5);
  for (int i = 0; i < 4; ++i) s.step();
  const optim::StateDict good = s.state_dict();
  Fixture g;
  optim::StepLR t(*g.opt, 3, 0.5);
  auto expect_rejected = [&](const char* k, double v) {
    optim::StateDict bad = good;
    bad.scalars[k] = v;
    EXPECT_TRUE(testing::throws_with([&] { t.load_state_dict(bad); }, {"[StepLR] load_state_dict", k}));
    EXPECT_EQ(t.last_epoch(), 0);  // unchanged
    EXPECT_EQ(t.base_lrs()[0], 0.05);
    EXPECT_EQ(t.get_last_lr()[1], 0.2);
  };
  expect_rejected("base_lr.0", std::nan(""));
  expect_rejected("base_lr.1", -0.1);
  expect_rejected("last_lr.0", -1e-3);
  expect_rejected("last_lr.1", kInf);
  t.load_state_dict(good);
  EXPECT_EQ(t.last_epoch(), 4);

  optim::ReduceLROnPlateau r(*g.opt);
  r.step(1.0);
  optim::StateDict d = r.state_dict();
  d.scalars["last_lr.1"] = -0.5;
  EXPECT_THROW(r.load_state_dict(d), Error);
  d = r.state_dict();
  d.scalars["best"] = std::nan("");
  EXPECT_THROW(r.load_state_dict(d), Error);
  EXPECT_EQ(r.best(), 1.0);
}

}  // namespace
}  // namespace strata
