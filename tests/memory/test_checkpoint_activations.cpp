// Activation checkpointing: gradients of inputs and closed-over parameters equal those of the
// plain function (bit for bit: the recomputation runs the same CPU kernels on the same values),
// dropout masks come back with the random state, the saved activations are freed, nesting,
// checkpoint_sequential, autocast, and bad input.
#include <strata/strata.hpp>

#include "gradcheck.h"

using namespace strata;
using strata::testing::values;

namespace {

// Gradients of sum(y * y) for each output y with respect to `leaves`, as plain values.
std::vector<std::vector<double>> grads_of(const std::vector<Tensor>& ys, const std::vector<Tensor>& leaves) {
  Tensor loss;
  for (const Tensor& y : ys) loss = loss.defined() ? loss + (y * y).sum() : (y * y).sum();
  std::vector<std::vector<double>> out;
  for (const Tensor& g : autograd::grad({loss}, leaves, {}, std::nullopt, false, true))
    out.push_back(g.defined() ? values(g) : std::vector<double>{});
  return out;
}

std::vector<Tensor> with(std::vector<Tensor> params, const Tensor& x) {
  params.insert(params.begin(), x);
  return params;
}

}  // namespace

TEST(Checkpoint, MlpGradientsMatchAndFunctionRunsTwice) {
  manual_seed(1);
  nn::Sequential mlp(nn::Linear(8, 16), nn::GELU(), nn::Linear(16, 8));
  Tensor x = randn({4, 8}).requires_grad_();
  auto leaves = with(mlp.parameters(), x);
  auto plain = grads_of({mlp(x)}, leaves);
  int runs = 0;
  Tensor y = memory::checkpoint([&](const Tensor& t) { ++runs; return mlp(t); }, x);
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(y.requires_grad());
  auto ckpt = grads_of({y}, leaves);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(ckpt, plain);
}

TEST(Checkpoint, BackwardAccumulatesIntoParameters) {
  manual_seed(2);
  nn::Linear fc(6, 5);
  Tensor x = randn({3, 6}).requires_grad_();
  (fc(x).tanh() * 3).sum().backward();
  std::vector<double> gw = values(fc.weight.grad()), gx = values(x.grad());
  fc.zero_grad();
  Tensor x2 = x.detach().requires_grad_();
  memory::checkpoint([&](const Tensor& t) { return (fc(t).tanh() * 3); }, x2).sum().backward();
  EXPECT_EQ(values(fc.weight.grad()), gw);
  EXPECT_EQ(values(x2.grad()), gx);
}

TEST(Checkpoint, TransformerBlockMatches) {
  manual_seed(3);
  nn::TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 32, .dropout = 0.0});
  Tensor x = randn({5, 2, 16}).requires_grad_();
  auto leaves = with(layer.parameters(), x);
  auto plain = grads_of({layer(x)}, leaves);
  auto ckpt = grads_of({memory::checkpoint([&](const Tensor& t) { return layer(t); }, x)}, leaves);
  EXPECT_EQ(ckpt, plain);
}

TEST(Checkpoint, DropoutMasksComeBackWithTheRandomState) {
  manual_seed(4);
  nn::TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 32, .dropout = 0.3});
  Tensor x = randn({5, 2, 16}).requires_grad_();
  auto leaves = with(layer.parameters(), x);
  manual_seed(7);
  auto plain = grads_of({layer(x)}, leaves);
  RandomDraw after_plain = default_generator().state();

  auto block = [&](const Tensor& t) { return layer(t); };
  manual_seed(7);
  Tensor y = memory::checkpoint(block, x);
  RandomDraw after_forward = default_generator().state();
  auto ckpt = grads_of({y}, leaves);
  EXPECT_EQ(ckpt, plain);
  // the recomputation leaves the generator where the forward left it
  EXPECT_EQ(default_generator().state().offset, after_forward.offset);
  EXPECT_EQ(after_forward.offset, after_plain.offset);

  manual_seed(7);
  auto unrestored = grads_of({memory::checkpoint(block, x, {.preserve_rng_state = false})}, leaves);
  EXPECT_NE(unrestored, plain);  // other masks in the recomputation: the test can fail
}

TEST(Checkpoint, OwnGeneratorIsRestored) {
  Generator gen(11);
  nn::Dropout drop(0.5, &gen);
  Tensor x = randn({64}).requires_grad_();
  auto fn = [&](const Tensor& t) { return drop(t * 2); };
  gen.manual_seed(5);
  auto plain = grads_of({fn(x)}, {x});
  gen.manual_seed(5);
  auto ckpt = grads_of({memory::checkpoint(fn, x, {.generators = {&gen}})}, {x});
  EXPECT_EQ(ckpt, plain);
  gen.manual_seed(5);
  auto unrestored = grads_of({memory::checkpoint(fn, x)}, {x});  // only the default generator restored
  EXPECT_NE(unrestored, plain);
}

TEST(Checkpoint, Gradcheck) {
  strata::testing::Fn f = [](const std::vector<Tensor>& in) {
    auto fn = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{(t[0] * t[1]).exp() + sin(t[0])}; };
    return memory::checkpoint(fn, in)[0];
  };
  Generator g(9);
  Tensor a = randn({3, 4}, kFloat64, &g).requires_grad_();
  Tensor b = randn({3, 4}, kFloat64, &g).requires_grad_();
  EXPECT_TRUE(strata::testing::gradcheck(f, {a, b}));
}

TEST(Checkpoint, ActivationsAreNotKept) {
  // eight layers of tanh(h W): matmul saves h, the previous tanh's output, and tanh its own, so
  // eight activations stay alive; checkpointed, only the output
  manual_seed(5);
  std::vector<Tensor> ws;
  for (int i = 0; i < 8; ++i) ws.push_back((randn({128, 128}) * 0.05).requires_grad_());
  auto deep = [&](const Tensor& x) {
    Tensor h = x;
    for (const Tensor& w : ws) h = matmul(h, w).tanh();
    return h;
  };
  Tensor x = randn({256, 128}).requires_grad_();
  auto leaves = with(ws, x);
  auto held_after_forward = [&](bool ckpt, std::vector<std::vector<double>>& grads) {
    int64_t before = cpu_memory_stats().bytes_in_use;
    Tensor y = ckpt ? memory::checkpoint(deep, x) : deep(x);
    int64_t held = cpu_memory_stats().bytes_in_use - before;
    grads = grads_of({y}, leaves);
    return held;
  };
  std::vector<std::vector<double>> plain, ckpt;
  int64_t plain_bytes = held_after_forward(false, plain);
  int64_t ckpt_bytes = held_after_forward(true, ckpt);
  EXPECT_EQ(ckpt, plain);
  const int64_t activation = 256 * 128 * 4;
  EXPECT_GE(plain_bytes, 8 * activation);
  EXPECT_LT(ckpt_bytes, 2 * activation);  // the output, and slack for small tensors
}

TEST(Checkpoint, Nested) {
  manual_seed(6);
  Tensor w1 = randn({6, 6}).requires_grad_(), w2 = randn({6, 6}).requires_grad_();
  Tensor x = randn({3, 6}).requires_grad_();
  int outer_runs = 0, inner_runs = 0;
  auto inner = [&](const Tensor& h) { ++inner_runs; return sin(matmul(h, w2)); };
  auto plain_fn = [&](const Tensor& t) { return inner(matmul(t, w1).tanh()) * t; };
  auto plain = grads_of({plain_fn(x)}, {x, w1, w2});
  inner_runs = 0;
  auto outer = [&](const Tensor& t) {
    ++outer_runs;
    return memory::checkpoint(inner, matmul(t, w1).tanh()) * t;
  };
  auto ckpt = grads_of({memory::checkpoint(outer, x)}, {x, w1, w2});
  EXPECT_EQ(ckpt, plain);
  EXPECT_EQ(outer_runs, 2);
  EXPECT_EQ(inner_runs, 3);  // forward, within the outer recomputation, its own recomputation
}

TEST(Checkpoint, SequentialSegments) {
  manual_seed(8);
  nn::Sequential seq(nn::Linear(6, 8), nn::Tanh(), nn::Linear(8, 8), nn::GELU(), nn::Linear(8, 4), nn::Tanh(),
                     nn::Linear(4, 4));
  Tensor x = randn({5, 6}).requires_grad_();
  auto leaves = with(seq.parameters(), x);
  auto plain = grads_of({seq(x)}, leaves);
  for (int64_t segments : {1, 2, 3, 7})
    EXPECT_EQ(grads_of({memory::checkpoint_sequential(seq, segments, x)}, leaves), plain) << segments;
  std::vector<nn::Module*> modules{&seq[0], &seq[1], &seq[2]};
  Tensor part = seq[2](seq[1](seq[0](x)));
  EXPECT_EQ(grads_of({memory::checkpoint_sequential(modules, 2, x)}, leaves), grads_of({part}, leaves));
}

TEST(Checkpoint, RecomputesUnderTheForwardsAutocast) {
  manual_seed(9);
  nn::Sequential mlp(nn::Linear(8, 16), nn::ReLU(), nn::Linear(16, 8));
  Tensor x = randn({4, 8}).requires_grad_();
  auto leaves = with(mlp.parameters(), x);
  Tensor plain_y, ckpt_y;
  {
    amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
    plain_y = mlp(x);
    ckpt_y = memory::checkpoint([&](const Tensor& t) { return mlp(t); }, x);
  }
  EXPECT_EQ(ckpt_y.dtype(), kBFloat16);
  // the backward runs outside the region; the recomputation must still run in bfloat16
  EXPECT_EQ(grads_of({ckpt_y.to(kFloat32)}, leaves), grads_of({plain_y.to(kFloat32)}, leaves));
}

TEST(Checkpoint, MixedInputsAndOutputs) {
  // an input that needs no grad, an integer input, an integer output, an output left unused
  manual_seed(10);
  Tensor x = randn({4, 3}).requires_grad_();
  Tensor c = randn({4, 3});
  Tensor idx = from_vector<int64_t>({2, 0}, Shape{2});
  Tensor w = randn({3, 3}).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor h = matmul(in[0] * in[1], w).tanh();
    return std::vector<Tensor>{index_select(h, 0, in[2]), in[2] + 1, h.exp()};
  };
  auto plain = fn({x, c, idx});
  auto ckpt = memory::checkpoint(fn, {x, c, idx});
  ASSERT_EQ(ckpt.size(), 3u);
  EXPECT_FALSE(ckpt[1].requires_grad());
  EXPECT_EQ(values(ckpt[1]), values(plain[1]));
  EXPECT_EQ(grads_of({ckpt[0]}, {x, w}), grads_of({plain[0]}, {x, w}));
}

TEST(Checkpoint, OnlyClosedOverParametersNeedGrad) {
  manual_seed(11);
  nn::Linear fc(4, 4);
  Tensor x = randn({2, 4});
  auto plain = grads_of({sin(fc(x))}, fc.parameters());
  auto ckpt = grads_of({memory::checkpoint([&](const Tensor& t) { return sin(fc(t)); }, x)}, fc.parameters());
  EXPECT_EQ(ckpt, plain);
}

TEST(Checkpoint, RetainedGraphRunsTwice) {
  Tensor x = randn({5}).requires_grad_();
  int runs = 0;
  Tensor y = memory::checkpoint([&](const Tensor& t) { ++runs; return t.exp().sum(); }, x);
  y.backward({}, true);
  y.backward();
  EXPECT_EQ(runs, 2);  // the recomputed tensors serve both passes
  EXPECT_TRUE(strata::testing::all_close(x.grad(), strata::testing::values(x.exp() * 2), 1e-6, 0));
}

TEST(Checkpoint, WithoutGradModeOnlyCallsTheFunction) {
  Tensor x = randn({3}).requires_grad_();
  int runs = 0;
  NoGradGuard no_grad;
  Tensor y = memory::checkpoint([&](const Tensor& t) { ++runs; return t * 2; }, x);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(y.requires_grad());
}

TEST(Checkpoint, BadInput) {
  Tensor x = randn({3}).requires_grad_();
  EXPECT_THROW(memory::checkpoint([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }, {x}), Error);
  EXPECT_THROW(memory::checkpoint(memory::CheckpointFn(), {x}), Error);
  EXPECT_THROW(memory::checkpoint([](const Tensor&) { return Tensor(); }, x), Error);
  EXPECT_THROW(memory::checkpoint([](const Tensor& t) { return t * 2; }, x, {.generators = {nullptr}}), Error);

  nn::Sequential seq(nn::Linear(3, 3), nn::Tanh());
  EXPECT_THROW(memory::checkpoint_sequential(seq, 0, x), Error);
  EXPECT_THROW(memory::checkpoint_sequential(seq, 3, x), Error);
  EXPECT_THROW(memory::checkpoint_sequential(std::vector<nn::Module*>{}, 1, x), Error);

  // double backward through a checkpoint is not supported
  Tensor y = memory::checkpoint([](const Tensor& t) { return (t * t).sum(); }, x);
  EXPECT_THROW(autograd::grad({y}, {x}, {}, std::nullopt, true), Error);

  // an input written in place after the forward
  Tensor c = randn({3});
  Tensor z = memory::checkpoint([](const std::vector<Tensor>& t) { return std::vector<Tensor>{(t[0] + t[1]).exp()}; },
                                {x, c})[0];
  c.add_(1);
  EXPECT_THROW(z.sum().backward(), Error);

  // a function that runs other ops the second time
  int runs = 0;
  Tensor w = memory::checkpoint([&](const Tensor& t) { return ++runs == 1 ? t.exp() : t.exp().tanh(); }, x);
  EXPECT_THROW(w.sum().backward(), Error);
}
