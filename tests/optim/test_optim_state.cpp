// Optimizer state dicts and bad input: 50 steps, save, a fresh optimizer loads the state and
// runs 50 more, bit for bit equal to 100 uninterrupted steps; and every misuse raises
// strata::Error and leaves the optimizer as it was.
#include <cstring>
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
  bad = good;
  bad.scalars["group.0.amsgrad"] = 1;  // needs max_exp_avg_sq, which the dict lacks
  expect_rejected(bad);
  target.load_state_dict(good);  // and the good one still loads
  EXPECT_EQ(target.param_groups()[0].options.lr, 1e-3);
  ASSERT_NE(target.state(e), nullptr);
  EXPECT_EQ(target.state(e)->step, 1);
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
  Tensor t = ones({3, 4}).t();
  EXPECT_THROW(optim::Adam({t}), Error);  // not contiguous

  optim::SGD opt({a});
  EXPECT_THROW(opt.add_param_group(std::vector<Tensor>{a}), Error);
  EXPECT_EQ(opt.num_param_groups(), 1u);
  opt.add_param_group({{b}, {.lr = 0.1}});
  EXPECT_EQ(opt.num_param_groups(), 2u);
  EXPECT_THROW(opt.add_param_group({{ones({2})}, {.lr = -1}}), Error);
  EXPECT_EQ(opt.num_param_groups(), 2u);
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
  b.set_grad(ones({2}, kFloat64));  // dtype differs from the parameter
  EXPECT_THROW(opt.step(), Error);
  EXPECT_TRUE(testing::all_close(a, {1, 1, 1}, 0, 0));  // a was valid but is untouched
  EXPECT_EQ(opt.state(a), nullptr);
  b.set_grad(ones({2}));
  opt.step();
  EXPECT_TRUE(testing::all_close(a, {0.9, 0.9, 0.9}, 1e-7, 0));
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
