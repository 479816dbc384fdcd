// Optimizer state dicts and bad input: 50 steps, save, a fresh optimizer loads the state and
// runs 50 more, bit for bit equal to 100 uninterrupted steps; and every misuse raises
// strata::Error and leaves the optimizer as it was.
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

#include "optim/optim_testing.h"

namespace strata {
namespace {

using testing::OptimProblem;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

std::vector<Tensor> copy_params(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) {
    Tensor c = p.detach().clone();
    c.requires_grad_();
    out.push_back(c);
  }
  return out;
}

// Runs steps [from, to) of the problem; at step 20 the schedule-like change of group 1's lr.
template <class Opt>
void run_steps(Opt& opt, const std::vector<Tensor>& ps, const OptimProblem& pr, int from, int to) {
  for (int t = from; t < to; ++t) {
    if (t == 20) opt.param_groups()[1].options.lr *= 0.5;
    testing::set_grads(ps, pr, t);
    opt.step();
  }
}

template <class Opt, class Options>
void expect_exact_resume(const std::vector<Options>& opts, DType dtype = kFloat32) {
  OptimProblem pr = testing::make_problem(100, 11);
  // uninterrupted
  std::vector<Tensor> ref = testing::make_params(pr, dtype);
  Opt full_run(testing::make_groups(pr, ref, opts));
  run_steps(full_run, ref, pr, 0, 100);
  // interrupted after 50 steps; the fresh optimizer is built with the original options
  std::vector<Tensor> ps = testing::make_params(pr, dtype);
  optim::StateDict saved;
  std::vector<Tensor> resumed;
  {
    Opt first(testing::make_groups(pr, ps, opts));
    run_steps(first, ps, pr, 0, 50);
    saved = first.state_dict();
    resumed = copy_params(ps);
    run_steps(first, ps, pr, 50, 60);  // the saved dict is a snapshot: later steps leave it alone
  }
  Opt second(testing::make_groups(pr, resumed, opts));
  second.load_state_dict(saved);
  EXPECT_EQ(second.param_groups()[1].options.lr, opts[1].lr * 0.5);
  for (int t = 50; t < 100; ++t) {  // no lr change at 20 here: it came with the state dict
    testing::set_grads(resumed, pr, t);
    second.step();
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(resumed[i], ref[i])) << second.name() << " parameter " << i;
    const optim::ParamState* a = full_run.state(ref[i]);
    const optim::ParamState* b = second.state(resumed[i]);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->step, b->step);
    ASSERT_EQ(a->tensors.size(), b->tensors.size());
    for (const auto& [name, t] : a->tensors) EXPECT_TRUE(bitwise_equal(t, b->tensors.at(name))) << name;
  }
}

TEST(OptimState, ExactResume) {
  expect_exact_resume<optim::SGD>(std::vector<optim::SGDOptions>{
      {.lr = 0.01, .momentum = 0.9, .nesterov = true}, {.lr = 0.02, .momentum = 0.5}, {.lr = 0.01}});
  expect_exact_resume<optim::Adam>(std::vector<optim::AdamOptions>{
      {.weight_decay = 0.01}, {.lr = 2e-3, .amsgrad = true}, {.eps = 1e-6}});
  expect_exact_resume<optim::AdamW>(std::vector<optim::AdamWOptions>{{}, {.amsgrad = true}, {.weight_decay = 0}},
                                    kFloat64);
  expect_exact_resume<optim::LAMB>(std::vector<optim::LAMBOptions>{
      {.weight_decay = 0.01}, {.bias_correction = false}, {.clamp_max = 0.5}});
  // min_8bit_size 100: the (300) parameter keeps 8-bit moments, the others fp32 ones
  expect_exact_resume<optim::Adam8bit>(std::vector<optim::Adam8bitOptions>{
      {.min_8bit_size = 100, .block_size = 64}, {.min_8bit_size = 100, .block_size = 64}, {.min_8bit_size = 100}});
  expect_exact_resume<optim::Adagrad>(std::vector<optim::AdagradOptions>{
      {.lr_decay = 0.01}, {.initial_accumulator_value = 0.1}, {}});
  expect_exact_resume<optim::RMSprop>(std::vector<optim::RMSpropOptions>{
      {.momentum = 0.9, .centered = true}, {.centered = true}, {.momentum = 0.5}});
  expect_exact_resume<optim::NAdam>(std::vector<optim::NAdamOptions>{
      {.weight_decay = 0.01}, {.weight_decay = 0.01, .decoupled_weight_decay = true}, {.momentum_decay = 0.01}});
  expect_exact_resume<optim::RAdam>(std::vector<optim::RAdamOptions>{
      {.weight_decay = 0.01}, {.weight_decay = 0.01, .decoupled_weight_decay = true}, {}}, kFloat64);
  expect_exact_resume<optim::Adamax>(std::vector<optim::AdamaxOptions>{{.weight_decay = 0.01}, {}, {.eps = 1e-6}});
  expect_exact_resume<optim::Adadelta>(std::vector<optim::AdadeltaOptions>{{.weight_decay = 0.01}, {.rho = 0.5}, {}});
}

// A channels-last parameter (Module::to(MemoryFormat::ChannelsLast)) trains as its contiguous
// twin: each update is elementwise, run over the parameter's memory with its grad and states
// laid out alike (Note [Parameter layouts] in src/optim/update_util.h), so the results are
// bit for bit equal; LAMB's norms sum in another order (close). The state dict holds the same
// values, and loads into the other layout.
template <class Opt, class Options>
void expect_layouts_agree(const Options& o, bool exact) {
  SCOPED_TRACE(Opt({ones({1})}, o).name());
  const Shape shape{6, 4, 3, 5};
  manual_seed(5);
  const Tensor w0 = randn(shape);
  Tensor a = w0.clone(), b = w0.to(MemoryFormat::ChannelsLast);
  a.requires_grad_();
  b.requires_grad_();
  ASSERT_FALSE(b.is_contiguous());
  auto same = [&](const Tensor& x, const Tensor& y) {
    if (exact) EXPECT_TRUE(bitwise_equal(x, y));
    else EXPECT_TRUE(testing::all_close(x, testing::values(y), 1e-5, 1e-7));
  };
  Opt oa({a}, o), ob({b}, o);
  for (int t = 0; t < 6; ++t) {
    const Tensor g = randn(shape);
    a.set_grad(g.clone());
    b.set_grad(t % 2 ? g.to(MemoryFormat::ChannelsLast) : g.clone());  // grads come in either layout
    oa.step();
    ob.step();
  }
  EXPECT_TRUE(b.is_contiguous(MemoryFormat::ChannelsLast));
  same(b, a);
  const optim::StateDict da = oa.state_dict(), db = ob.state_dict();
  ASSERT_EQ(da.tensors.size(), db.tensors.size());
  for (const auto& [key, t] : da.tensors) same(db.tensors.at(key), t);
  // the channels-last optimizer's state continues a contiguous copy of its parameter
  Tensor c = b.detach().contiguous();
  c.requires_grad_();
  Opt oc({c}, o);
  oc.load_state_dict(db);
  const Tensor g = randn(shape);
  b.set_grad(g.clone());
  c.set_grad(g.clone());
  ob.step();
  oc.step();
  same(c, b);
}

TEST(OptimState, ChannelsLastParameters) {
  expect_layouts_agree<optim::SGD>(optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .nesterov = true}, true);
  expect_layouts_agree<optim::AdamW>(optim::AdamWOptions{.amsgrad = true}, true);
  expect_layouts_agree<optim::Adagrad>(optim::AdagradOptions{.initial_accumulator_value = 0.1}, true);
  expect_layouts_agree<optim::RMSprop>(optim::RMSpropOptions{.momentum = 0.5, .centered = true}, true);
  expect_layouts_agree<optim::NAdam>(optim::NAdamOptions{.weight_decay = 0.01}, true);
  expect_layouts_agree<optim::Adadelta>(optim::AdadeltaOptions{}, true);
  expect_layouts_agree<optim::LAMB>(optim::LAMBOptions{.weight_decay = 0.01}, false);
  expect_layouts_agree<optim::Adam8bit>(optim::Adam8bitOptions{.min_8bit_size = 1 << 20}, true);
  // 8-bit codes follow a parameter's memory order: a channels-last one keeps 32-bit moments
  Tensor p = randn({8, 4, 3, 3}).to(MemoryFormat::ChannelsLast);
  p.requires_grad_();
  optim::Adam8bit opt({p}, {.min_8bit_size = 16});
  p.set_grad(ones({8, 4, 3, 3}));
  opt.step();
  EXPECT_EQ(opt.state(p)->tensors.count("exp_avg"), 1u);
  EXPECT_EQ(opt.state(p)->tensors.count("exp_avg_codes"), 0u);
  // so a dict loads into the other layout: 8-bit codes become a channels-last parameter's
  // 32-bit moments (decoded), and those moments a contiguous parameter's codes again
  Tensor q = randn({8, 4, 3, 3});
  q.requires_grad_();
  optim::Adam8bit oq({q}, {.min_8bit_size = 16, .block_size = 64});
  q.set_grad(randn({8, 4, 3, 3}));
  oq.step();
  Tensor r = q.detach().to(MemoryFormat::ChannelsLast);
  r.requires_grad_();
  optim::Adam8bit orr({r}, {.min_8bit_size = 16});
  orr.load_state_dict(oq.state_dict());  // block_size 64 comes with the dict
  EXPECT_EQ(orr.state(r)->tensors.count("exp_avg"), 1u);
  EXPECT_EQ(orr.state(r)->step, 1);
  const optim::Adam8bit::Moments mq = oq.moments(q), mr = orr.moments(r);
  EXPECT_TRUE(bitwise_equal(mr.exp_avg.contiguous(), mq.exp_avg));
  EXPECT_TRUE(bitwise_equal(mr.exp_avg_sq.contiguous(), mq.exp_avg_sq));
  Tensor c = r.detach().contiguous();
  c.requires_grad_();
  optim::Adam8bit oc({c}, {.min_8bit_size = 16});
  oc.load_state_dict(orr.state_dict());
  EXPECT_EQ(oc.state(c)->tensors.count("exp_avg_codes"), 1u);
  EXPECT_EQ(oc.state(c)->tensors.at("exp_avg_absmax").numel(), (288 + 63) / 64);
  // quantized again: within the 8-bit map's spacing of the original moments
  const optim::Adam8bit::Moments mc = oc.moments(c);
  EXPECT_TRUE(testing::all_close(mc.exp_avg, testing::values(mq.exp_avg), 2e-2, 1e-6));
  EXPECT_TRUE(testing::all_close(mc.exp_avg_sq, testing::values(mq.exp_avg_sq), 2e-2, 1e-8));
  // and the runs go on alike
  const Tensor g = randn({8, 4, 3, 3});
  q.set_grad(g.clone());
  r.set_grad(g.clone());
  c.set_grad(g.clone());
  oq.step();
  orr.step();
  oc.step();
  EXPECT_TRUE(testing::all_close(r, testing::values(q), 1e-4, 1e-6));
  EXPECT_TRUE(testing::all_close(c, testing::values(q), 1e-4, 2e-5));  // a step moves by ~1e-3 (lr)
  // codes that do not fit the parameter are refused as before, naming the entry
  optim::StateDict bad = oq.state_dict();
  bad.tensors["state.0.exp_avg_absmax"] = zeros({3});
  Tensor r2 = q.detach().to(MemoryFormat::ChannelsLast);
  r2.requires_grad_();
  optim::Adam8bit o2({r2}, {.min_8bit_size = 16});
  EXPECT_THROW(o2.load_state_dict(bad), Error);
  EXPECT_EQ(o2.state(r2), nullptr);
}

TEST(OptimState, StateDictContents) {
  Tensor a = ones({2, 3}), b = ones({4});
  a.requires_grad_();
  b.requires_grad_();
  optim::AdamW opt({{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.2, .amsgrad = true}}});
  a.set_grad(ones({2, 3}));
  opt.step();
  optim::StateDict d = opt.state_dict();
  EXPECT_EQ(d.type, "AdamW");
  EXPECT_EQ(d.scalars.at("group.0.lr"), 0.1);
  EXPECT_EQ(d.scalars.at("group.1.amsgrad"), 1.0);
  EXPECT_EQ(d.scalars.at("group.1.num_params"), 1.0);
  EXPECT_EQ(d.scalars.at("state.0.step"), 1.0);
  EXPECT_EQ(d.scalars.count("state.1.step"), 0u);  // b had no grad: no state yet
  EXPECT_EQ(d.tensors.at("state.0.exp_avg").shape(), (Shape{2, 3}));
  EXPECT_TRUE(testing::all_close(d.tensors.at("state.0.exp_avg"), std::vector<double>(6, 0.1), 1e-6, 0));
}

TEST(OptimState, LoadRejectsForeignOrMismatchedDicts) {
  Tensor a = ones({4, 5});
  a.requires_grad_();
  optim::Adam adam({a});
  a.set_grad(ones({4, 5}));
  adam.step();
  optim::StateDict good = adam.state_dict();

  Tensor b = ones({4, 5});
  b.requires_grad_();
  optim::AdamW adamw({b});
  EXPECT_THROW(adamw.load_state_dict(good), Error);  // another optimizer type

  Tensor c = ones({5, 4});
  c.requires_grad_();
  optim::Adam other_shape({c});
  EXPECT_THROW(other_shape.load_state_dict(good), Error);

  Tensor d1 = ones({4, 5}), d2 = ones({3});
  d1.requires_grad_();
  d2.requires_grad_();
  optim::Adam two_params({d1, d2});
  EXPECT_THROW(two_params.load_state_dict(good), Error);
  optim::Adam two_groups({{{d1}, {}}, {{d2}, {}}});
  EXPECT_THROW(two_groups.load_state_dict(good), Error);

  Tensor e = ones({4, 5});
  e.requires_grad_();
  optim::Adam target({e}, {.lr = 0.5});
  auto expect_rejected = [&](const optim::StateDict& bad) {
    EXPECT_THROW(target.load_state_dict(bad), Error);
    EXPECT_EQ(target.param_groups()[0].options.lr, 0.5);  // unchanged
    EXPECT_EQ(target.state(e), nullptr);
  };
  optim::StateDict bad = good;
  bad.tensors.erase("state.0.exp_avg_sq");
  expect_rejected(bad);
  bad = good;
  bad.tensors["state.0.exp_avg"] = ones({20});
  expect_rejected(bad);
  bad = good;
  bad.tensors["state.0.exp_avg"] = ones({4, 5}, kInt64);
  expect_rejected(bad);
  bad = good;
  bad.tensors["state.0.unknown"] = ones({4, 5});
  expect_rejected(bad);
  bad = good;
  bad.tensors["state.7.exp_avg"] = ones({4, 5});
  expect_rejected(bad);
  bad = good;
  bad.scalars["group.0.beta1"] = 1.5;  // invalid hyperparameter
  expect_rejected(bad);
  bad = good;
  bad.scalars.erase("group.0.eps");
  expect_rejected(bad);
  bad = good;
  bad.scalars["state.0.step"] = -3;
  expect_rejected(bad);
  {  // amsgrad on but no max_exp_avg_sq: a dict taken after amsgrad was switched on, before the
     // step that creates it (Note [Option changes]), loads
    optim::StateDict switched = good;
    switched.scalars["group.0.amsgrad"] = 1;
    Tensor f = ones({4, 5});
    f.requires_grad_();
    optim::Adam o({f});
    o.load_state_dict(switched);
    EXPECT_TRUE(o.param_groups()[0].options.amsgrad);
    EXPECT_EQ(o.state(f)->tensors.count("max_exp_avg_sq"), 0u);
  }
  target.load_state_dict(good);  // and the good one still loads
  EXPECT_EQ(target.param_groups()[0].options.lr, 1e-3);
  ASSERT_NE(target.state(e), nullptr);
  EXPECT_EQ(target.state(e)->step, 1);
}

TEST(OptimState, LoadRejectsBadOptionValues) {
  Tensor a = ones({3});
  a.requires_grad_();
  optim::AdamW opt({a}, {.lr = 0.5});
  a.set_grad(ones({3}));
  opt.step();
  optim::LinearLR sched(opt, 0.5);  // records initial_lr 0.5
  const optim::StateDict good = opt.state_dict();
  ASSERT_EQ(good.scalars.at("group.0.initial_lr"), 0.5);
  Tensor b = ones({3});
  b.requires_grad_();
  optim::AdamW target({b}, {.lr = 0.1});
  auto expect_rejected = [&](const char* k, double v, const char* why) {
    optim::StateDict bad = good;
    bad.scalars[k] = v;
    EXPECT_TRUE(testing::throws_with([&] { target.load_state_dict(bad); }, {"[AdamW] load_state_dict", k, why}));
    EXPECT_EQ(target.param_groups()[0].options.lr, 0.1);  // unchanged
    EXPECT_FALSE(target.param_groups()[0].options.amsgrad);
    EXPECT_EQ(target.state(b), nullptr);
    EXPECT_FALSE(target.initial_lr(0).has_value());
  };
  expect_rejected("group.0.amsgrad", 0.5, "not a bool");
  expect_rejected("group.0.maximize", std::nan(""), "not a bool");
  expect_rejected("group.0.maximize", 2, "not a bool");
  expect_rejected("group.0.initial_lr", std::nan(""), "not an lr");
  expect_rejected("group.0.initial_lr", -1, "not an lr");
  expect_rejected("group.0.initial_lr", INFINITY, "not an lr");
  target.load_state_dict(good);
  EXPECT_EQ(target.initial_lr(0).value_or(-1), 0.5);
  EXPECT_THROW(target.set_initial_lr(0, std::nan("")), Error);
  EXPECT_THROW(target.set_initial_lr(0, -0.1), Error);
  EXPECT_EQ(target.initial_lr(0).value_or(-1), 0.5);
}

// Note [Option changes] in optimizer.cpp: a state the options no longer use is dropped at the
// next step (and left out of state dicts at once), one they newly use starts from zeros, and
// the step count carries on.
TEST(OptimState, OptionChangesBetweenSteps) {
  auto grad = [](int t) { return from_vector(std::vector<double>{0.5 * t, -1, 2.0 - t, 0.25}).to(kFloat32); };
  auto param = [](const std::vector<double>& v) {
    Tensor p = from_vector(v).to(kFloat32);
    p.requires_grad_();
    return p;
  };
  auto names = [](const optim::ParamState* st) {
    std::vector<std::string> n;
    for (const auto& [name, t] : st->tensors) n.push_back(name);
    return n;
  };
  // AdamW amsgrad on, off, on: vmax = max(0, v) = v whenever it is (re)created, so each step
  // matches an AdamW without amsgrad
  Tensor p = param({1, -2, 3, 0.5}), q = param({1, -2, 3, 0.5});
  optim::AdamW o({p}, {.lr = 0.1, .amsgrad = true});
  optim::AdamW ref({q}, {.lr = 0.1});
  for (int t = 1; t <= 3; ++t) {
    o.param_groups()[0].options.amsgrad = t != 2;
    if (t == 2) {  // dropped from a dict taken right after the change, before any step
      optim::StateDict d = o.state_dict();
      EXPECT_EQ(d.tensors.count("state.0.max_exp_avg_sq"), 0u);
      Tensor r = param({0, 0, 0, 0});
      optim::AdamW fresh({r}, {.amsgrad = false});
      fresh.load_state_dict(d);
      EXPECT_EQ(fresh.state(r)->step, 1);
    }
    p.set_grad(grad(t));
    q.set_grad(grad(t));
    o.step();
    ref.step();
    EXPECT_EQ(testing::values(p), testing::values(q)) << "step " << t;
    EXPECT_EQ(o.state(p)->step, t);
  }
  const optim::ParamState* st = o.state(p);
  EXPECT_EQ(names(st), (std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}));
  EXPECT_EQ(testing::values(st->tensors.at("max_exp_avg_sq")), testing::values(st->tensors.at("exp_avg_sq")));

  // RMSprop centered with momentum, then plain (grad_avg and momentum_buffer dropped), then
  // centered again (grad_avg from zeros), against the formulas in float64
  const double lr = 0.01, alpha = 0.9, mom = 0.5, eps = 1e-8;
  std::vector<double> want = {1, -2, 3, 0.5}, v(4, 0), gavg(4, 0), buf(4, 0);
  Tensor w = param(want);
  optim::RMSprop r({w}, {.lr = lr, .alpha = alpha, .momentum = mom, .centered = true});
  for (int t = 1; t <= 3; ++t) {
    const bool centered = t != 2;
    r.param_groups()[0].options.centered = centered;
    r.param_groups()[0].options.momentum = t == 1 ? mom : 0;
    if (t == 2) {
      Tensor x = param({0, 0, 0, 0});
      optim::RMSprop fresh({x}, {.lr = lr, .alpha = alpha});
      fresh.load_state_dict(r.state_dict());
      EXPECT_EQ(names(fresh.state(x)), (std::vector<std::string>{"square_avg"}));
    }
    if (t == 3) gavg.assign(4, 0);
    std::vector<double> g = testing::values(grad(t));
    for (size_t i = 0; i < 4; ++i) {
      v[i] = alpha * v[i] + (1 - alpha) * g[i] * g[i];
      double vt = v[i];
      if (centered) {
        gavg[i] = alpha * gavg[i] + (1 - alpha) * g[i];
        vt -= gavg[i] * gavg[i];
      }
      double step = g[i] / (std::sqrt(vt) + eps);
      if (t == 1) step = buf[i] = mom * buf[i] + step;
      want[i] -= lr * step;
    }
    w.set_grad(grad(t));
    r.step();
    EXPECT_TRUE(testing::all_close(w, want, 1e-6, 1e-7)) << "step " << t;
    EXPECT_EQ(r.state(w)->step, t);
  }
  EXPECT_EQ(names(r.state(w)), (std::vector<std::string>{"grad_avg", "square_avg"}));
  EXPECT_TRUE(testing::all_close(r.state(w)->tensors.at("grad_avg"), gavg, 1e-6, 1e-7));
  Tensor y = param({0, 0, 0, 0});
  optim::RMSprop again({y}, {.centered = true});
  again.load_state_dict(r.state_dict());
  EXPECT_EQ(again.state(y)->step, 3);
}

// A dict taken after an option was switched on, before a step created the state it asks for,
// loads (into the same optimizer and a fresh one), and both then step the same.
TEST(OptimState, StateAnOptionNewlyAsksForIsOptionalOnLoad) {
  auto param = [](const std::vector<double>& v) {
    Tensor p = from_vector(v).to(kFloat32);
    p.requires_grad_();
    return p;
  };
  const Tensor g1 = from_vector(std::vector<double>{0.5, -1, 2, 0.25}).to(kFloat32);
  const Tensor g2 = from_vector(std::vector<double>{-0.5, 3, 1, -2}).to(kFloat32);
  auto check = [&](optim::Optimizer& o, const Tensor& p, const std::function<void()>& switch_on,
                   const std::function<std::unique_ptr<optim::Optimizer>(const Tensor&)>& make) {
    p.set_grad(g1);
    o.step();
    switch_on();
    const optim::StateDict d = o.state_dict();
    o.load_state_dict(d);  // refused before: the dict lacked the new state
    Tensor q = param({0, 0, 0, 0});
    std::unique_ptr<optim::Optimizer> fresh = make(q);
    fresh->load_state_dict(d);
    NoGradGuard no_grad;
    q.copy_(p);
    p.set_grad(g2);
    q.set_grad(g2);
    o.step();
    fresh->step();
    EXPECT_EQ(testing::values(p), testing::values(q)) << o.name();
    EXPECT_EQ(fresh->state(q)->tensors.size(), o.state(p)->tensors.size()) << o.name();
  };
  Tensor a = param({1, -2, 3, 0.5});
  optim::AdamW adamw({a}, {.lr = 0.1});
  check(adamw, a, [&] { adamw.param_groups()[0].options.amsgrad = true; },
        [](const Tensor& q) {
          return std::make_unique<optim::AdamW>(std::vector<Tensor>{q},
                                                optim::AdamWOptions{.lr = 0.1, .amsgrad = true});
        });
  Tensor b = param({1, -2, 3, 0.5});
  optim::RMSprop rms({b}, {.lr = 0.01});
  check(rms, b,
        [&] {
          rms.param_groups()[0].options.centered = true;
          rms.param_groups()[0].options.momentum = 0.5;
        },
        [](const Tensor& q) {
          return std::make_unique<optim::RMSprop>(std::vector<Tensor>{q},
                                                  optim::RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true});
        });
}

TEST(OptimState, BadParameters) {
  Tensor a = ones({3});
  a.requires_grad_();
  Tensor b = ones({3});
  b.requires_grad_();
  EXPECT_THROW(optim::SGD({a, a}), Error);  // listed twice
  EXPECT_THROW(optim::SGD({{{a}, {}}, {{b, a}, {}}}), Error);  // across groups
  EXPECT_THROW(optim::SGD(std::vector<Tensor>{}), Error);
  EXPECT_THROW(optim::SGD({Tensor()}), Error);
  Tensor non_leaf = a * 2.0;
  EXPECT_FALSE(non_leaf.is_leaf());
  EXPECT_THROW(optim::Adam({non_leaf}), Error);
  EXPECT_THROW(optim::Adam({ones({3}, kInt64)}), Error);
  EXPECT_THROW(optim::Adam({ones({3}, kFloat16)}), Error);
  EXPECT_THROW(optim::Adam({ones({3}, kBFloat16)}), Error);
  // hyperparameters must be finite: an infinite lr or weight decay turns the weights NaN
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW(optim::AdamW({b}, {.lr = inf}), Error);
  EXPECT_THROW(optim::AdamW({b}, {.weight_decay = inf}), Error);
  EXPECT_THROW(optim::SGD({b}, {.lr = inf}), Error);
  EXPECT_THROW(optim::LAMB({b}, {.lr = inf}), Error);
  Tensor t = ones({3, 4}).t();
  EXPECT_THROW(optim::Adam({t}), Error);  // neither contiguous nor channels-last
  Tensor permuted = ones({2, 3, 4, 5}).permute({0, 2, 1, 3});
  permuted.requires_grad_();
  EXPECT_THROW(optim::Adam({permuted}), Error);

  optim::SGD opt({a});
  EXPECT_THROW(opt.add_param_group(std::vector<Tensor>{a}), Error);
  EXPECT_EQ(opt.num_param_groups(), 1u);
  opt.add_param_group({{b}, {.lr = 0.1}});
  EXPECT_EQ(opt.num_param_groups(), 2u);
  EXPECT_THROW(opt.add_param_group({{ones({2})}, {.lr = -1}}), Error);
  EXPECT_EQ(opt.num_param_groups(), 2u);
}

// As in torch.optim: a group given without options takes the constructor's defaults.
TEST(OptimState, GroupsWithoutOptionsTakeTheDefaults) {
  auto param = [](std::vector<double> v) {
    Tensor t = from_vector(v).to(kFloat64);
    t.requires_grad_();
    return t;
  };
  const optim::AdamWOptions defaults{.lr = 3e-4, .betas = {0.8, 0.95}, .weight_decay = 0.05};
  const optim::AdamWOptions no_decay{.lr = 1e-2, .weight_decay = 0};
  Tensor w = param({1.0, -2.0, 0.5}), b = param({0.25, 4.0});
  const std::vector<Tensor> weights{w}, biases{b};
  optim::AdamW opt({{weights}, {biases, no_decay}}, defaults);
  ASSERT_EQ(opt.num_param_groups(), 2u);
  EXPECT_EQ(opt.param_groups()[0].options.lr, 3e-4);
  EXPECT_EQ(opt.param_groups()[0].options.betas[0], 0.8);
  EXPECT_EQ(opt.param_groups()[0].options.weight_decay, 0.05);
  EXPECT_EQ(opt.param_groups()[1].options.lr, 1e-2);
  EXPECT_EQ(opt.param_groups()[1].options.weight_decay, 0.0);
  EXPECT_FALSE(opt.param_groups()[0].takes_defaults);

  // the steps equal those of one-group optimizers made with the same options
  Tensor w_alone = param({1.0, -2.0, 0.5}), b_alone = param({0.25, 4.0});
  optim::AdamW opt_w({w_alone}, defaults), opt_b({b_alone}, no_decay);
  for (int step = 0; step < 3; ++step) {
    const Tensor gw = from_vector(std::vector<double>{0.3, -0.1 * step, 2.0}).to(kFloat64);
    const Tensor gb = from_vector(std::vector<double>{-1.0, 0.5 + step}).to(kFloat64);
    w.set_grad(gw.clone()), w_alone.set_grad(gw.clone());
    b.set_grad(gb.clone()), b_alone.set_grad(gb.clone());
    opt.step(), opt_w.step(), opt_b.step();
  }
  EXPECT_TRUE(equal(w.detach(), w_alone.detach()));
  EXPECT_TRUE(equal(b.detach(), b_alone.detach()));

  // add_param_group, with and without options
  Tensor c = param({1.0}), d = param({2.0});
  opt.add_param_group(optim::ParamGroup<optim::AdamWOptions>({c}));
  opt.add_param_group({{d}, {.lr = 0.5}});
  EXPECT_EQ(opt.param_groups()[2].options.weight_decay, 0.05);
  EXPECT_EQ(opt.param_groups()[3].options.lr, 0.5);
  EXPECT_EQ(opt.param_groups()[3].options.weight_decay, optim::AdamWOptions{}.weight_decay);

  // options changed on a group that takes the defaults would be dropped: refused instead
  Tensor e = param({3.0});
  optim::ParamGroup<optim::SGDOptions> changed({e});
  changed.options.lr = 0.5;
  EXPECT_THROW(optim::SGD({changed}, {.lr = 0.1}), Error);
  EXPECT_THROW(opt.add_param_group([&] {
    optim::ParamGroup<optim::AdamWOptions> g({e});
    g.options.eps = 1e-3;
    return g;
  }()), Error);
  EXPECT_EQ(opt.num_param_groups(), 4u);
}

TEST(OptimState, BadOptions) {
  Tensor a = ones({3});
  a.requires_grad_();
  EXPECT_THROW(optim::SGD({a}, {.lr = -0.1}), Error);
  EXPECT_THROW(optim::SGD({a}, {.momentum = -0.1}), Error);
  EXPECT_THROW(optim::SGD({a}, {.weight_decay = -1}), Error);
  EXPECT_THROW(optim::SGD({a}, {.nesterov = true}), Error);  // no momentum
  EXPECT_THROW(optim::SGD({a}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(optim::Adam({a}, {.lr = -1e-3}), Error);
  EXPECT_THROW(optim::Adam({a}, {.betas = {1.0, 0.999}}), Error);
  EXPECT_THROW(optim::Adam({a}, {.betas = {0.9, -0.1}}), Error);
  EXPECT_THROW(optim::AdamW({a}, {.eps = -1e-8}), Error);
  EXPECT_THROW(optim::AdamW({a}, {.lr = std::nan("")}), Error);
  EXPECT_THROW(optim::LAMB({a}, {.betas = {0.9, 1.0}}), Error);
  EXPECT_THROW(optim::LAMB({a}, {.clamp_min = 2, .clamp_max = 1}), Error);
  EXPECT_THROW(optim::Adam8bit({a}, {.block_size = 0}), Error);
  EXPECT_THROW(optim::Adam8bit({a}, {.block_size = 8192}), Error);
  EXPECT_THROW(optim::Adam8bit({a}, {.min_8bit_size = -1}), Error);
  EXPECT_THROW(optim::Adagrad({a}, {.lr_decay = -1}), Error);
  EXPECT_THROW(optim::Adagrad({a}, {.initial_accumulator_value = -1}), Error);
  EXPECT_THROW(optim::RMSprop({a}, {.alpha = -0.5}), Error);
  EXPECT_THROW(optim::RMSprop({a}, {.eps = -1}), Error);

  optim::Adam opt({a});
  opt.param_groups()[0].options.betas[1] = 1.0;  // made invalid after construction
  a.set_grad(ones({3}));
  EXPECT_THROW(opt.step(), Error);
  EXPECT_TRUE(testing::all_close(a, {1, 1, 1}, 0, 0));
}

TEST(OptimState, BadGradsChangeNothing) {
  Tensor a = ones({3}), b = ones({2});
  a.requires_grad_();
  b.requires_grad_();
  optim::SGD opt({a, b}, {.lr = 0.1});
  a.set_grad(ones({3}));
  b.set_grad(ones({2}));
  b.set_data(ones({2}, kFloat64));  // the grad's dtype now differs from the parameter's
  EXPECT_THROW(opt.step(), Error);
  EXPECT_TRUE(testing::all_close(a, {1, 1, 1}, 0, 0));  // a was valid but is untouched
  EXPECT_EQ(opt.state(a), nullptr);
  b.set_data(ones({2}));
  opt.step();
  EXPECT_TRUE(testing::all_close(a, {0.9, 0.9, 0.9}, 1e-7, 0));
}

// A model converted to float64 after some steps (Module::to) takes its optimizer's states
// along: the next step equals that of an optimizer built on float64 copies that loaded the
// float32 state dict (which load_state_dict converts).
template <class Opt, class Options>
void expect_dtype_change_keeps_state(const Options& options) {
  nn::Linear model(5, 3);
  Opt opt(model.parameters(), options);
  const Tensor x = randn({4, 5});
  auto backward = [&](DType t) {
    model.zero_grad();
    model(x.to(t)).sum().backward();
  };
  backward(kFloat32);
  opt.step();
  const optim::StateDict dict = opt.state_dict();
  model.to(kFloat64);
  std::vector<Tensor> twin = copy_params(model.parameters());
  Opt twin_opt(twin, options);
  twin_opt.load_state_dict(dict);
  backward(kFloat64);
  for (size_t i = 0; i < twin.size(); ++i) twin[i].set_grad(model.parameters()[i].grad().clone());
  opt.step();
  twin_opt.step();
  for (size_t i = 0; i < twin.size(); ++i) {
    EXPECT_EQ(model.parameters()[i].dtype(), kFloat64);
    EXPECT_TRUE(bitwise_equal(model.parameters()[i].detach(), twin[i].detach())) << opt.name() << " parameter " << i;
  }
  for (const auto& [name, t] : opt.state_dict().tensors)
    if (is_floating(t.dtype()) && name.find("absmax") == std::string::npos) EXPECT_EQ(t.dtype(), kFloat64) << name;
}

TEST(OptimState, ParameterDtypeChangedByModuleTo) {
  expect_dtype_change_keeps_state<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  expect_dtype_change_keeps_state<optim::AdamW>(optim::AdamWOptions{.amsgrad = true});
  expect_dtype_change_keeps_state<optim::Adagrad>(optim::AdagradOptions{});
  expect_dtype_change_keeps_state<optim::RMSprop>(optim::RMSpropOptions{.momentum = 0.5, .centered = true});
  expect_dtype_change_keeps_state<optim::LAMB>(optim::LAMBOptions{});
  expect_dtype_change_keeps_state<optim::Adam8bit>(optim::Adam8bitOptions{.min_8bit_size = 4});
}

TEST(OptimState, ParamReplacedAfterConstruction) {
  Tensor a = ones({4});
  a.requires_grad_();
  optim::Adam opt({a});
  a.set_grad(ones({4}));
  opt.step();
  a.set_data(ones({2, 3}));
  a.set_grad(ones({2, 3}));
  EXPECT_THROW(opt.step(), Error);  // its state no longer fits
}

TEST(OptimState, MomentumAccessForSchedulers) {
  Tensor a = ones({2});
  a.requires_grad_();
  optim::AdamW adamw({a}, {.betas = {0.8, 0.9}});
  ASSERT_TRUE(adamw.has_momentum());
  EXPECT_EQ(adamw.momentum(0), 0.8);
  adamw.set_momentum(0, 0.85);
  EXPECT_EQ(adamw.param_groups()[0].options.betas[0], 0.85);
  optim::SGD sgd({a}, {.momentum = 0.9});
  EXPECT_EQ(sgd.momentum(0), 0.9);
  optim::Adagrad adagrad({a});
  EXPECT_FALSE(adagrad.has_momentum());
  EXPECT_THROW(adagrad.momentum(0), Error);
  EXPECT_THROW(sgd.lr(3), Error);
}

}  // namespace
}  // namespace strata
