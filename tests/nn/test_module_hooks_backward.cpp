// Full backward pre-hooks and global backward hooks: call order (global before the module's, as
// torch's, prepend), a replaced grad_output against the input and weight gradients computed by
// hand in float64, multi-output calls with an output that needs no gradient, removal (while
// running too), the call path without hooks, and errors raised in hooks.
#include <algorithm>
#include <string>
#include <vector>

#include <strata/memory/checkpoint.hpp>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::Mat;
using strata::testing::matmul_nt;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

const std::vector<double> kW = {1, 2, 3, -1};  // (out, in)

nn::Linear known_linear() {
  nn::Linear lin(2, 2);
  lin.to(kFloat64);
  lin.weight.detach().copy_(from_vector<double>(kW, Shape{2, 2}));
  lin.bias.detach().copy_(from_vector<double>({0.5, -2}));
  return lin;
}

Mat mat(const std::vector<double>& v, int64_t rows, int64_t cols) {
  Mat m(rows, cols);
  m.v = v;
  return m;
}

Mat transpose(const Mat& a) {
  Mat t(a.cols, a.rows);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) t(j, i) = a(i, j);
  return t;
}

// Exposes the check a call makes to take the path without hooks.
struct ProbedLinear : nn::Linear {
  ProbedLinear() : nn::Linear(2, 2) {}
  using Module::hooks_active;
};

// (a, b) -> {a * b, a + b, a detached}: two differentiable outputs and one that needs no gradient.
struct ThreeOutputs : nn::Module {
  using Module::operator();
  std::vector<Tensor> operator()(const Tensor& a, const Tensor& b) {
    return call_hooked({a, b}, [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{in[0] * in[1], in[0] + in[1], in[0].detach()};
    });
  }
};

}  // namespace

TEST(ModuleBackwardHooks, PreHookReplacesGradOutputAndTheGradientsFollow) {
  nn::Linear lin = known_linear();
  const std::vector<double> xv = {1, -2, 0.5, 3}, cv = {1, 2, -1, 0.5};  // x (N=2, in), c = d loss / d y
  Tensor x = from_vector<double>(xv, Shape{2, 2}).requires_grad_();
  Tensor seen_by_pre, seen_by_full;
  lin.register_full_backward_pre_hook([&](nn::Module&, const Tensor& grad_out) {
    seen_by_pre = grad_out;
    return grad_out * 2.0 + 1.0;
  });
  lin.register_full_backward_hook([&](nn::Module&, const Tensor&, const Tensor& grad_out) { seen_by_full = grad_out; });
  (lin(x) * from_vector<double>(cv, Shape{2, 2})).sum().backward();

  std::vector<double> dv;  // the replacement, by hand
  for (double c : cv) dv.push_back(2 * c + 1);
  const Mat d = mat(dv, 2, 2), w = mat(kW, 2, 2), xm = mat(xv, 2, 2);
  EXPECT_TRUE(all_close(seen_by_pre, cv, 0, 0));
  EXPECT_TRUE(all_close(seen_by_full, dv, 0, 0));       // the full hook sees the replacement
  EXPECT_TRUE(all_close(x.grad(), matmul_nt(d, transpose(w)).v, 1e-12, 0));  // d W
  EXPECT_TRUE(all_close(lin.weight.grad(), matmul_nt(transpose(d), transpose(xm)).v, 1e-12, 0));  // d^T x
  EXPECT_TRUE(all_close(lin.bias.grad(), {dv[0] + dv[2], dv[1] + dv[3]}, 1e-12, 0));
}

TEST(ModuleBackwardHooks, GlobalHooksRunBeforeTheModulesOwnAndPrependPutsFirst) {
  nn::Linear lin = known_linear();
  std::vector<std::string> order;
  auto pre = [&](std::string tag) { return [&order, tag](nn::Module&, const Tensor&) { order.push_back(tag); }; };
  auto full = [&](std::string tag) {
    return [&order, tag](nn::Module&, const Tensor&, const Tensor&) { order.push_back(tag); };
  };
  std::vector<nn::RemovableHandle> handles{
      lin.register_full_backward_hook(full("full")), lin.register_full_backward_pre_hook(pre("pre")),
      lin.register_full_backward_pre_hook(pre("pre prepended"), /*prepend=*/true),
      nn::register_module_full_backward_hook(full("global full")),
      nn::register_module_full_backward_pre_hook(pre("global pre")),
      lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) { order.push_back("forward"); })};
  Tensor x = from_vector<double>({1, 2}, Shape{1, 2}).requires_grad_();
  lin(x).sum().backward();
  EXPECT_EQ(order, (std::vector<std::string>{"forward", "global pre", "pre prepended", "pre", "global full", "full"}));
  for (auto& h : handles) h.remove();
  order.clear();
  lin(x).sum().backward();
  EXPECT_TRUE(order.empty());
}

TEST(ModuleBackwardHooks, MultipleOutputsAndAnOutputWithoutGradient) {
  ThreeOutputs m;
  const std::vector<double> av = {1, -2, 3}, bv = {0.5, 4, -1}, c0 = {2, -1, 1}, c1 = {1, 3, -2};
  Tensor a = from_vector<double>(av).requires_grad_(), b = from_vector<double>(bv).requires_grad_();
  std::vector<std::string> seen;
  m.register_full_backward_pre_hook([&](nn::Module&, std::vector<Tensor>& grad_outputs) {
    for (const Tensor& g : grad_outputs) seen.push_back(g.defined() ? "defined" : "undefined");
    EXPECT_TRUE(all_close(grad_outputs[0], c0, 0, 0));
    EXPECT_TRUE(all_close(grad_outputs[1], c1, 0, 0));
    // the first doubled; a replacement for the detached output is ignored
    return std::vector<Tensor>{grad_outputs[0] * 2.0, grad_outputs[1], ones(Shape{3}, kFloat64)};
  });
  std::vector<Tensor> global_grad_outputs;
  size_t global_grad_inputs = 0;
  nn::RemovableHandle global = nn::register_module_full_backward_hook(
      [&](nn::Module&, std::vector<Tensor>& grad_inputs, const std::vector<Tensor>& grad_outputs) {
        global_grad_inputs = grad_inputs.size();
        global_grad_outputs = grad_outputs;
      });
  std::vector<Tensor> out = m(a, b);
  ((out[0] * from_vector<double>(c0)).sum() + (out[1] * from_vector<double>(c1)).sum()).backward();
  global.remove();
  EXPECT_EQ(seen, (std::vector<std::string>{"defined", "defined", "undefined"}));
  ASSERT_EQ(global_grad_outputs.size(), 3u);  // the global full hook sees the pre-hook's replacement
  EXPECT_EQ(global_grad_inputs, 2u);
  std::vector<double> doubled_c0;
  for (double c : c0) doubled_c0.push_back(2 * c);
  EXPECT_TRUE(all_close(global_grad_outputs[0], doubled_c0, 0, 0));
  EXPECT_FALSE(global_grad_outputs[2].defined());
  std::vector<double> ga, gb;  // d/da (a b . 2 c0 + (a + b) . c1) = 2 c0 b + c1, and likewise for b
  for (size_t i = 0; i < av.size(); ++i) {
    ga.push_back(2 * c0[i] * bv[i] + c1[i]);
    gb.push_back(2 * c0[i] * av[i] + c1[i]);
  }
  EXPECT_TRUE(all_close(a.grad(), ga, 1e-12, 0));
  EXPECT_TRUE(all_close(b.grad(), gb, 1e-12, 0));

  // the one-input form sees the first output's gradient; a wrong count raises
  ThreeOutputs one;
  Tensor first_seen;
  one.register_full_backward_pre_hook([&](nn::Module&, const Tensor& g) { first_seen = g; });
  one(a, b)[0].sum().backward();
  EXPECT_TRUE(all_close(first_seen, {1, 1, 1}, 0, 0));
  ThreeOutputs bad;
  bad.register_full_backward_pre_hook([](nn::Module&, std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  EXPECT_TRUE(throws_with([&] { bad(a, b)[0].sum().backward(); },
                          {"backward pre-hook must return 3 output gradients, got 1"}));
}

TEST(ModuleBackwardHooks, RemovalWhileRunningAndAfterTheForward) {
  nn::Linear lin = known_linear();
  int self_removing = 0, removed_after_forward = 0;
  nn::RemovableHandle self;
  self = lin.register_full_backward_pre_hook([&](nn::Module&, const Tensor&) {
    ++self_removing;
    self.remove();
  });
  nn::RemovableHandle later =
      lin.register_full_backward_pre_hook([&](nn::Module&, const Tensor&) { ++removed_after_forward; });
  Tensor x = from_vector<double>({1, 2}, Shape{1, 2}).requires_grad_();
  Tensor y = lin(x);
  later.remove();  // the call took its hooks when it ran forward, as torch's does
  y.sum().backward();
  lin(x).sum().backward();
  EXPECT_EQ(self_removing, 1);
  EXPECT_EQ(removed_after_forward, 1);
}

TEST(ModuleBackwardHooks, WithoutHooksCallsTakeThePathWithoutHooks) {
  ProbedLinear lin;
  EXPECT_FALSE(lin.hooks_active());
  nn::RemovableHandle state = lin.register_state_dict_post_hook([](const nn::Module&, nn::StateDict&,
                                                                   const std::string&) {});
  EXPECT_FALSE(lin.hooks_active());  // state dict hooks leave calls alone
  nn::RemovableHandle global = nn::register_module_full_backward_pre_hook([](nn::Module&, const Tensor&) {});
  EXPECT_TRUE(lin.hooks_active());
  global.remove();
  EXPECT_FALSE(lin.hooks_active());
  nn::RemovableHandle own = lin.register_full_backward_pre_hook([](nn::Module&, const Tensor&) {});
  EXPECT_TRUE(lin.hooks_active());
  own.remove();
  lin(ones(Shape{1, 2}));  // the first call after the last removal drops the empty registry
  EXPECT_FALSE(lin.hooks_active());
  state.remove();
}

TEST(ModuleBackwardHooks, ErrorsInHooksPropagateAndLeaveTheModuleUsable) {
  nn::Linear lin = known_linear();
  const Tensor c = from_vector<double>({3, -1}, Shape{1, 2});
  nn::RemovableHandle raising = lin.register_full_backward_pre_hook([](nn::Module& m, const Tensor&) {
    STRATA_CHECK(false, "[{}] refused by the hook", m.name());
  });
  Tensor x = from_vector<double>({1, -2}, Shape{1, 2}).requires_grad_();
  EXPECT_TRUE(throws_with([&] { (lin(x) * c).sum().backward(); }, {"[Linear] refused by the hook"}));
  raising.remove();
  nn::RemovableHandle global = nn::register_module_full_backward_hook([](nn::Module&, const Tensor&, const Tensor&) {
    throw Error("global hook failed");
  });
  EXPECT_TRUE(throws_with([&] { (lin(x) * c).sum().backward(); }, {"global hook failed"}));
  global.remove();
  nn::RemovableHandle bad_shape =
      lin.register_full_backward_pre_hook([](nn::Module&, const Tensor& g) { return g.reshape({2, 1}); });
  EXPECT_TRUE(throws_with([&] { (lin(x) * c).sum().backward(); },
                          {"[Linear] a backward pre-hook must return a gradient of shape", "for output 0"}));
  bad_shape.remove();
  nn::RemovableHandle bad_dtype =
      lin.register_full_backward_pre_hook([](nn::Module&, const Tensor& g) { return g.to(kFloat32); });
  EXPECT_TRUE(throws_with([&] { (lin(x) * c).sum().backward(); }, {"[Linear] a backward pre-hook", "float32"}));
  bad_dtype.remove();
  // the failures left no trace: x.grad = c W exactly, with W = [[1, 2], [3, -1]]
  lin.zero_grad();
  Tensor x2 = x.detach().clone().requires_grad_();
  (lin(x2) * c).sum().backward();
  EXPECT_TRUE(all_close(x2.grad(), {3 * 1 - 1 * 3, 3 * 2 - 1 * -1}, 1e-12, 0));
  EXPECT_TRUE(all_close(lin.weight.grad(), {3 * 1, 3 * -2, -1 * 1, -1 * -2}, 1e-12, 0));  // c^T x
  EXPECT_FALSE(lin.has_hooks());
  EXPECT_FALSE(nn::has_global_forward_hooks());
}

// A module called twice in one step runs each call's hooks with that call's gradients; a
// checkpointed call runs them once (the recomputed graph is never run backward).
TEST(ModuleBackwardHooks, EachCallRunsItsOwnHooksAndACheckpointedCallRunsThemOnce) {
  nn::Linear lin = known_linear();
  std::vector<std::vector<double>> pre_seen;
  int full_calls = 0;
  lin.register_full_backward_pre_hook([&](nn::Module&, const Tensor& g) {
    pre_seen.push_back(values(g));
    return g * 2.0;
  });
  lin.register_full_backward_hook([&](nn::Module&, const Tensor&, const Tensor&) { ++full_calls; });
  Tensor x = from_vector<double>({1, -2}, Shape{1, 2}).requires_grad_();
  Tensor y1 = lin(x), y2 = lin(x);
  ((y1 * from_vector<double>({1, 2}, Shape{1, 2})).sum() + (y2 * from_vector<double>({3, 4}, Shape{1, 2})).sum())
      .backward();
  ASSERT_EQ(pre_seen.size(), 2u);
  std::sort(pre_seen.begin(), pre_seen.end());
  EXPECT_EQ(pre_seen[0], (std::vector<double>{1, 2}));
  EXPECT_EQ(pre_seen[1], (std::vector<double>{3, 4}));
  EXPECT_EQ(full_calls, 2);
  EXPECT_TRUE(all_close(lin.bias.grad(), {2 * (1 + 3), 2 * (2 + 4)}, 1e-12, 0));

  pre_seen.clear();
  full_calls = 0;
  lin.zero_grad();
  Tensor c = memory::checkpoint([&](const Tensor& in) { return lin(in); }, x);
  (c * from_vector<double>({1, 2}, Shape{1, 2})).sum().backward();
  EXPECT_EQ(pre_seen.size(), 1u);
  EXPECT_EQ(full_calls, 1);
  EXPECT_TRUE(all_close(lin.bias.grad(), {2, 4}, 1e-12, 0));
}

// As torch's, a pre-hook may return an undefined gradient (None) for an output: no gradient
// flows back from it, and the full backward hooks see it undefined.
TEST(ModuleBackwardHooks, PreHookReturningAnUndefinedGradientStopsIt) {
  ThreeOutputs m;
  Tensor a = from_vector<double>({1, -2, 3}).requires_grad_(), b = from_vector<double>({0.5, 4, -1}).requires_grad_();
  m.register_full_backward_pre_hook([](nn::Module&, std::vector<Tensor>& g) {
    return std::vector<Tensor>{Tensor(), g[1], g[2]};
  });
  bool first_undefined = false;
  m.register_full_backward_hook([&](nn::Module&, std::vector<Tensor>&, const std::vector<Tensor>& g) {
    first_undefined = !g[0].defined();
  });
  std::vector<Tensor> out = m(a, b);
  (out[0].sum() + out[1].sum()).backward();
  EXPECT_TRUE(first_undefined);
  EXPECT_TRUE(all_close(a.grad(), {1, 1, 1}, 0, 0));  // d/da (a + b) only
  EXPECT_TRUE(all_close(b.grad(), {1, 1, 1}, 0, 0));
}

// A call's output gradients are its backward's: a later backward that reaches the inputs without
// the outputs (through a tensor the forward kept) sees them undefined, not the earlier ones.
TEST(ModuleBackwardHooks, ALaterBackwardDoesNotSeeAnEarlierOnesOutputGradients) {
  struct Keeping : nn::Module {
    Tensor kept;
    Tensor forward(const Tensor& x) override {
      kept = x;
      return x * 2.0;
    }
  } m;
  std::vector<bool> defined;
  m.register_full_backward_hook([&](nn::Module&, const Tensor&, const Tensor& g) { defined.push_back(g.defined()); });
  Tensor x = from_vector<double>({1, 2}).requires_grad_();
  m(x).sum().backward();
  m.kept.sum().backward();
  EXPECT_EQ(defined, (std::vector<bool>{true, false}));
  EXPECT_TRUE(all_close(x.grad(), {3, 3}, 0, 0));
}
