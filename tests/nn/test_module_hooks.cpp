// Module forward hooks: order and replacement of input and output against values computed by
// hand in float64, removal, hooks through Sequential and member children, moved modules, global
// hooks, no_grad, and gradients through a hook that scales the output (against the gradient of
// the unhooked model, scaled).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

// y = W x + b with W = [[1, 2], [3, -1]], b = [0.5, -2], in float64.
nn::Linear known_linear() {
  nn::Linear lin(2, 2);
  lin.to(kFloat64);
  lin.weight.detach().copy_(from_vector<double>({1, 2, 3, -1}, Shape{2, 2}));
  lin.bias.detach().copy_(from_vector<double>({0.5, -2}));
  return lin;
}

std::vector<double> known_linear_of(double x0, double x1) { return {x0 + 2 * x1 + 0.5, 3 * x0 - x1 - 2}; }

struct Net : nn::Module {
  nn::Linear fc1{3, 4};
  nn::Sequential body{nn::ReLU(), nn::Linear(4, 2)};
  Net() {
    register_module("fc1", fc1);
    register_module("body", body);
  }
  Tensor forward(const Tensor& x) override { return body(fc1(x)); }
  std::string name() const override { return "Net"; }
};

}  // namespace

TEST(ModuleHooks, RunInOrderAndReplaceInputAndOutput) {
  nn::Linear lin = known_linear();
  std::vector<std::string> order;
  Tensor seen_by_forward_hook;
  lin.register_forward_pre_hook([&](nn::Module&, const Tensor& x) {
    order.push_back("pre double");
    return x * 2.0;
  });
  lin.register_forward_pre_hook([&](nn::Module&, const Tensor& x) {
    order.push_back("pre plus one");
    return x + 1.0;
  });
  lin.register_forward_pre_hook([&](nn::Module& m, const Tensor&) {
    order.push_back("pre first " + m.name());
  }, /*prepend=*/true);
  lin.register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor& out) {
    order.push_back("post triple");
    seen_by_forward_hook = in;
    return out * 3.0;
  });
  lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
    order.push_back("post minus one");
    return out - 1.0;
  });
  Tensor y = lin(from_vector<double>({1, -2, 0.25, 4}, Shape{2, 2}));
  // each row: 3 * (W (2 x + 1) + b) - 1
  std::vector<double> want;
  for (auto [a, b] : {std::pair{1.0, -2.0}, std::pair{0.25, 4.0}})
    for (double v : known_linear_of(2 * a + 1, 2 * b + 1)) want.push_back(3 * v - 1);
  EXPECT_TRUE(all_close(y, want, 1e-12, 0));
  EXPECT_TRUE(all_close(seen_by_forward_hook, {3, -3, 1.5, 9}, 0, 0));  // the forward hook sees the new input
  EXPECT_EQ(order, (std::vector<std::string>{"pre first Linear", "pre double", "pre plus one", "post triple",
                                             "post minus one"}));
  // forward() itself runs no hooks
  EXPECT_TRUE(all_close(lin.forward(from_vector<double>({1, -2}, Shape{1, 2})), known_linear_of(1, -2), 1e-12, 0));
}

TEST(ModuleHooks, RemoveUnregistersAndIsSafeTwiceAndAfterTheModule) {
  nn::Linear lin = known_linear();
  int pre = 0, post = 0;
  nn::RemovableHandle hp = lin.register_forward_pre_hook([&](nn::Module&, const Tensor&) { ++pre; });
  nn::RemovableHandle ho = lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) { ++post; });
  EXPECT_LT(hp.id(), ho.id());
  Tensor x = from_vector<double>({1, 1}, Shape{1, 2});
  lin(x);
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
  hp.remove();
  lin(x);
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 2);
  hp.remove();  // a second remove does nothing
  { nn::RemovableHandle dropped = lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {}); }
  lin(x);
  EXPECT_EQ(post, 3);  // destroying a handle leaves its hook (as torch's)
  ho.remove();
  EXPECT_TRUE(lin.has_hooks());  // the dropped handle's hook is still there
  {
    nn::Linear gone(2, 2);
    ho = gone.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {});
  }
  ho.remove();  // the module is gone: nothing to do
}

TEST(ModuleHooks, AHookMayRemoveItselfWhileRunning) {
  nn::Linear lin = known_linear();
  int calls = 0;
  nn::RemovableHandle self;
  self = lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
    ++calls;
    self.remove();
  });
  Tensor x = from_vector<double>({1, 1}, Shape{1, 2});
  lin(x);
  lin(x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(lin.has_hooks());
}

TEST(ModuleHooks, RunThroughSequentialAndMemberChildren) {
  Net net;
  std::vector<std::string> calls;
  auto record = [&](const std::string& who) {
    return [&calls, who](nn::Module&, const Tensor&, const Tensor&) { calls.push_back(who); };
  };
  net.fc1.register_forward_hook(record("fc1"));
  net.body[0].register_forward_hook(record("body.0"));
  net.body[1].register_forward_hook(record("body.1"));
  net.body.register_forward_hook(record("body"));
  net.register_forward_hook(record("net"));
  net(randn({2, 3}));
  EXPECT_EQ(calls, (std::vector<std::string>{"fc1", "body.0", "body.1", "body", "net"}));
}

TEST(ModuleHooks, AHookedBatchNormBeforeReLUStillRunsAndSeesItsOwnOutput) {
  // Sequential runs BatchNorm2d + ReLU as one pass; a hook on either must still see its call
  nn::Sequential seq{nn::BatchNorm2d(3), nn::ReLU()};
  Tensor x = randn({2, 3, 4, 4});
  Tensor plain = seq(x);
  Tensor bn_out;
  seq[0].register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) { bn_out = out; });
  Tensor hooked = seq(x);
  ASSERT_TRUE(bn_out.defined());
  EXPECT_TRUE(all_close(hooked, values(plain), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(relu(bn_out), values(plain), 1e-6, 1e-6));
  const std::vector<double> bn_values = values(bn_out);
  EXPECT_LT(*std::min_element(bn_values.begin(), bn_values.end()), 0.0);  // its own output, before the ReLU

  // a backward hook on the ReLU also keeps the two apart: it sees the ReLU's own gradients
  nn::Sequential seq2{nn::BatchNorm2d(3), nn::ReLU()};
  int calls = 0;
  seq2[1].register_full_backward_hook([&](nn::Module&, const Tensor& grad_in, const Tensor& grad_out) {
    ++calls;
    EXPECT_TRUE(all_close(grad_out, std::vector<double>(96, 1.0), 0, 0));
    EXPECT_TRUE(all_close(grad_in, values(gt(bn_out, 0.0).to(kFloat32)), 0, 0));  // d relu / d x
  });
  seq2(x.clone().requires_grad_()).sum().backward();
  EXPECT_EQ(calls, 1);
}

TEST(ModuleHooks, AMovedModuleKeepsItsHooksAndHandles) {
  nn::Linear a = known_linear();
  int calls = 0;
  nn::RemovableHandle h = a.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    ++calls;
    return out * 2.0;
  });
  nn::Sequential seq;
  nn::Linear& moved = seq.push_back(std::move(a));
  Tensor y = seq(from_vector<double>({1, -2}, Shape{1, 2}));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(all_close(y, {2 * known_linear_of(1, -2)[0], 2 * known_linear_of(1, -2)[1]}, 1e-12, 0));
  h.remove();  // the handle still reaches the moved module's hooks
  EXPECT_FALSE(moved.has_hooks());

  Net net;
  net.fc1.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) { ++calls; });
  Net net2 = std::move(net);
  net2(randn({1, 3}));
  EXPECT_EQ(calls, 2);
}

TEST(ModuleHooks, GlobalHooksRunForEveryModuleBeforeTheModulesOwn) {
  Net net;
  std::vector<std::string> calls;
  net.fc1.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) { calls.push_back("own fc1"); });
  nn::RemovableHandle pre = nn::register_module_forward_pre_hook(
      [&](nn::Module& m, const Tensor&) { calls.push_back("pre " + m.name()); });
  nn::RemovableHandle post = nn::register_module_forward_hook(
      [&](nn::Module& m, const Tensor&, const Tensor&) { calls.push_back("post " + m.name()); });
  net(randn({2, 3}));
  pre.remove();
  post.remove();
  EXPECT_EQ(calls, (std::vector<std::string>{"pre Net", "pre Linear", "post Linear", "own fc1", "pre Sequential",
                                             "pre ReLU", "post ReLU", "pre Linear", "post Linear", "post Sequential",
                                             "post Net"}));
  calls.clear();
  net(randn({2, 3}));
  EXPECT_EQ(calls, std::vector<std::string>{"own fc1"});
}

TEST(ModuleHooks, RunUnderNoGrad) {
  nn::Linear lin = known_linear();
  int calls = 0;
  lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    ++calls;
    return out * 2.0;
  });
  NoGradGuard no_grad;
  Tensor y = lin(from_vector<double>({1, -2}, Shape{1, 2}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(all_close(y, {2 * known_linear_of(1, -2)[0], 2 * known_linear_of(1, -2)[1]}, 1e-12, 0));
}

TEST(ModuleHooks, GradientsFlowThroughAHookThatScalesTheOutput) {
  Generator g(7);
  Net net;
  net.to(kFloat64);
  Tensor x = strata::testing::randn64({5, 3}, g), target = strata::testing::randn64({5, 2}, g);
  auto grads = [&] {
    net.zero_grad();
    Tensor y = net(x);
    ((y - target) * (y - target)).sum().backward();
    std::vector<std::vector<double>> out;
    for (const Tensor& p : net.parameters()) out.push_back(values(p.grad()));
    return out;
  };
  // reference: the model with its last layer scaled by hand, d/dtheta sum((1.5 f - t)^2)
  auto scaled = [&] {
    net.zero_grad();
    Tensor y = net.forward(x) * 1.5;  // Net::forward calls its children's operator(), unhooked here
    ((y - target) * (y - target)).sum().backward();
    std::vector<std::vector<double>> out;
    for (const Tensor& p : net.parameters()) out.push_back(values(p.grad()));
    return out;
  }();
  net.body.register_forward_hook([](nn::Module&, const Tensor&, const Tensor& out) { return out * 1.5; });
  auto hooked = grads();
  ASSERT_EQ(hooked.size(), scaled.size());
  for (size_t i = 0; i < hooked.size(); ++i) EXPECT_TRUE(all_close(hooked[i], scaled[i], 1e-12, 1e-12)) << i;
}

TEST(ModuleHooks, AlwaysCallHooksRunWhenTheForwardRaises) {
  nn::Linear lin = known_linear();
  std::vector<std::string> calls;
  lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) { calls.push_back("plain"); });
  lin.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    calls.push_back(out.defined() ? "always, with output" : "always, no output");
  }, false, /*always_call=*/true);
  EXPECT_TRUE(throws_with([&] { lin(from_vector<double>({1, 2, 3}, Shape{1, 3})); }, {"Linear"}));
  EXPECT_EQ(calls, std::vector<std::string>{"always, no output"});
  calls.clear();
  lin(from_vector<double>({1, 2}, Shape{1, 2}));
  EXPECT_EQ(calls, (std::vector<std::string>{"plain", "always, with output"}));
}

TEST(ModuleHooks, BadHooksRaise) {
  nn::Linear lin = known_linear();
  EXPECT_TRUE(throws_with([&] { lin.register_forward_hook(nn::ForwardHook()); }, {"hook is empty"}));
  lin.register_forward_pre_hook([](nn::Module&, const Tensor&) { return Tensor(); });
  EXPECT_TRUE(throws_with([&] { lin(from_vector<double>({1, 1}, Shape{1, 2})); },
                          {"[Linear]", "pre-hook returned an undefined tensor"}));
}

TEST(ModuleHooks, FullBackwardHookSeesAndReplacesTheInputGradient) {
  nn::Linear lin = known_linear();
  Tensor x = from_vector<double>({1, -2, 0.5, 3}, Shape{2, 2}).requires_grad_();
  const Tensor c = from_vector<double>({1, 2, -1, 0.5}, Shape{2, 2});  // d loss / d y
  Tensor seen_in, seen_out;
  std::vector<std::string> order;
  lin.register_full_backward_hook([&](nn::Module& m, const Tensor& grad_in, const Tensor& grad_out) {
    order.push_back("first " + m.name());
    seen_in = grad_in;
    seen_out = grad_out;
    return grad_in * 2.0;
  });
  nn::RemovableHandle second = lin.register_full_backward_hook([&](nn::Module&, const Tensor& grad_in, const Tensor&) {
    order.push_back("second");
    EXPECT_TRUE(all_close(grad_in, values(seen_in * 2.0), 0, 0));  // sees the first's replacement
  });
  (lin(x) * c).sum().backward();
  EXPECT_EQ(order, (std::vector<std::string>{"first Linear", "second"}));
  EXPECT_TRUE(all_close(seen_out, values(c), 0, 0));
  // grad_input = c W with W = [[1, 2], [3, -1]]: rows (1 + 6, 2 - 2) and (-1 + 1.5, -2 - 0.5)
  EXPECT_TRUE(all_close(seen_in, {7, 0, 0.5, -2.5}, 1e-12, 0));
  EXPECT_TRUE(all_close(x.grad(), {14, 0, 1, -5}, 1e-12, 0));
  // the weight's gradient is untouched: c^T x
  EXPECT_TRUE(all_close(lin.weight.grad(), {1 * 1 + -1 * 0.5, 1 * -2 + -1 * 3, 2 * 1 + 0.5 * 0.5, 2 * -2 + 0.5 * 3},
                        1e-12, 0));
  second.remove();
  order.clear();
  Tensor x2 = x.detach().clone().requires_grad_();
  (lin(x2) * c).sum().backward();
  EXPECT_EQ(order, std::vector<std::string>{"first Linear"});
}

TEST(ModuleHooks, FullBackwardHookWithoutAnInputGradient) {
  nn::Linear lin = known_linear();
  const Tensor x = from_vector<double>({1, -2}, Shape{1, 2}), c = from_vector<double>({3, -1}, Shape{1, 2});
  int calls = 0;
  nn::RemovableHandle h = lin.register_full_backward_hook([&](nn::Module&, const Tensor& grad_in,
                                                              const Tensor& grad_out) {
    ++calls;
    EXPECT_FALSE(grad_in.defined());
    EXPECT_TRUE(all_close(grad_out, {3, -1}, 0, 0));
  });
  (lin(x) * c).sum().backward();
  EXPECT_EQ(calls, 1);
  {
    NoGradGuard no_grad;
    lin(x);  // no graph, no backward hook
  }
  h.remove();
  lin.register_full_backward_hook([](nn::Module&, const Tensor&, const Tensor&) { return Tensor(); });
  Tensor xr = x.clone().requires_grad_();
  EXPECT_TRUE(throws_with([&] { (lin(xr) * c).sum().backward(); }, {"[Linear]", "backward hook must return"}));
}
