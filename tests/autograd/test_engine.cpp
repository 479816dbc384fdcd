// The backward engine: accumulation, retain_graph, create_graph, autograd::grad, hooks,
// saved-tensor hooks, in-place detection, deep graphs, custom Functions, and gradients
// formed only for the inputs that need them.
#include <map>
#include <thread>
#include <vector>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::values;

TEST(Engine, ChainAndAccumulation) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor y = x * x + x * 3;  // dy/dx = 2x + 3 (x used twice)
  y.backward(ones({3}, kFloat64));
  EXPECT_TRUE(all_close(x.grad(), {5, 7, 9}, 1e-12, 0));
  // a second backward accumulates
  Tensor z = x * 2;
  z.backward(ones({3}, kFloat64));
  EXPECT_TRUE(all_close(x.grad(), {7, 9, 11}, 1e-12, 0));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn()->name(), "add");
  EXPECT_FALSE(y.grad().defined());  // non-leaves keep no grad unless asked
}

TEST(Engine, AccumulatedGradIsDenseAndOwned) {
  // sum's backward hands the leaf an expanded (stride 0) gradient, a transpose a strided one:
  // the stored grad is a dense tensor that accumulation, zero_grad and clipping write into
  Tensor a = ones({3}, kFloat64).requires_grad_();
  a.sum().backward();
  EXPECT_NE(a.grad().stride(0), 0);
  a.sum().backward();
  EXPECT_TRUE(all_close(a.grad(), {2, 2, 2}, 0, 0));
  Tensor ga = a.grad();
  ga.fill_(0);  // zero_grad without dropping the tensor
  (a * 3).sum().backward();
  EXPECT_TRUE(all_close(a.grad(), {3, 3, 3}, 0, 0));

  Tensor m = from_vector<double>({1, 2, 3, 4, 5, 6}, Shape{2, 3}).requires_grad_();
  (m.t() * from_vector<double>({1, 2}, Shape{1, 2})).sum().backward();
  (m.t() * 3).sum().backward();
  EXPECT_TRUE(all_close(m.grad(), {4, 4, 4, 5, 5, 5}, 0, 0));
  Tensor gm = m.grad();
  gm.mul_(2);
  EXPECT_TRUE(all_close(m.grad(), {8, 8, 8, 10, 10, 10}, 0, 0));

  // create_graph keeps the gradient differentiable, and dense too
  Tensor b = from_vector<double>({1, 2}).requires_grad_();
  b.sum().backward({}, /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_NE(b.grad().stride(0), 0);
  (b * b).sum().backward({}, true, true);
  EXPECT_TRUE(all_close(b.grad(), {3, 5}, 0, 0));
  b.set_grad(Tensor());  // the recorded grad refers to b: a cycle, as in PyTorch, broken by hand
  // add's backward hands both leaves one gradient tensor: each keeps its own, create_graph or not
  for (bool create : {false, true}) {
    Tensor x = ones({2}, kFloat64).requires_grad_(), y = ones({2}, kFloat64).requires_grad_();
    (x + y).backward(ones({2}, kFloat64), false, create);
    EXPECT_FALSE(x.grad().storage() == y.grad().storage()) << create;
    Tensor gx = x.grad();
    gx.mul_(3);
    EXPECT_TRUE(all_close(y.grad(), {1, 1}, 0, 0)) << create;
  }

  // a grad set by the user to an expanded view is accumulated into out of place
  Tensor c = zeros({4}, kFloat64).requires_grad_();
  c.set_grad(full({1}, 1.0, kFloat64).expand({4}));
  c.sum().backward();
  EXPECT_TRUE(all_close(c.grad(), {2, 2, 2, 2}, 0, 0));
  EXPECT_THROW(c.set_grad(ones({4}, kFloat32)), Error);  // dtype
}

TEST(Engine, LeafHookMustKeepTheGradientsShapeAndDtype) {
  Tensor x = ones({3}).requires_grad_();
  x.register_hook([](const Tensor&) { return ones({5}); });
  EXPECT_THROW(x.sum().backward(), Error);
  Tensor y = ones({3}).requires_grad_();
  y.register_hook([](const Tensor& g) { return g.to(kInt64); });
  EXPECT_THROW(y.sum().backward(), Error);
  Tensor z = ones({3}).requires_grad_();
  z.register_hook([](const Tensor&) { return ones({1}); });  // would broadcast
  EXPECT_THROW(z.sum().backward(), Error);
  EXPECT_FALSE(z.grad().defined());
}

// The same for a hook on an intermediate tensor: a gradient of another shape had been summed
// down silently, one of another dtype truncated.
TEST(Engine, OutputHookMustKeepTheGradientsShapeAndDtype) {
  Tensor x = ones({3}).requires_grad_();
  Tensor y = x * 2;
  y.register_hook([](const Tensor&) { return ones({2, 3}); });
  EXPECT_TRUE(strata::testing::throws_with([&] { y.sum().backward(); }, {"gradient hook", "[3]", "[2, 3]"}));
  EXPECT_FALSE(x.grad().defined());
  Tensor a = ones({3}).requires_grad_();
  Tensor b = a * 2;
  b.register_hook([](const Tensor& g) { return g.to(kInt64); });
  EXPECT_THROW(exp(b).sum().backward(), Error);
  Tensor c = ones({3}, kFloat64).requires_grad_();
  Tensor d = c * 2;
  d.register_hook([](const Tensor& g) { return g.to(kFloat32); });
  EXPECT_THROW(d.sum().backward(), Error);
  // a hook that keeps the kind of gradient still replaces it
  Tensor e = ones({3}).requires_grad_();
  Tensor f = e * 2;
  f.register_hook([](const Tensor& g) { return g * 10; });
  f.sum().backward();
  EXPECT_TRUE(all_close(e.grad(), {20, 20, 20}, 0, 0));
}

TEST(Engine, ScalarRootAndErrors) {
  Tensor x = from_vector<double>({1, 2}).requires_grad_();
  EXPECT_THROW((x * 2).backward(), Error);  // non-scalar needs a gradient
  EXPECT_THROW(ones({2}).backward(), Error);  // nothing requires grad
  EXPECT_THROW((x * 2).backward(ones({3}, kFloat64)), Error);
  EXPECT_THROW(ones({2}, kInt32).requires_grad_(), Error);
  Tensor y = x * 2;
  EXPECT_THROW(y.requires_grad_(false), Error);
}

TEST(Engine, RetainGraph) {
  Tensor x = from_vector<double>({2}).requires_grad_();
  Tensor y = exp(x) * x;
  y.backward(Tensor(), /*retain_graph=*/true);
  double first = x.grad().item<double>();
  EXPECT_NEAR(first, std::exp(2.0) * 3, 1e-12);
  y.backward();
  EXPECT_NEAR(x.grad().item<double>(), 2 * first, 1e-12);
  EXPECT_THROW(y.backward(), Error);  // saved tensors freed by the second (non-retaining) pass
}

TEST(Engine, CreateGraphDoubleBackward) {
  Tensor x = from_vector<double>({1.5}).requires_grad_();
  Tensor y = x * x * x;
  std::vector<Tensor> g = autograd::grad({y}, {x}, {}, std::nullopt, /*create_graph=*/true);
  EXPECT_NEAR(g[0].item<double>(), 3 * 1.5 * 1.5, 1e-12);
  EXPECT_TRUE(g[0].requires_grad());
  std::vector<Tensor> gg = autograd::grad({g[0]}, {x});
  EXPECT_NEAR(gg[0].item<double>(), 6 * 1.5, 1e-12);
  EXPECT_FALSE(x.grad().defined());  // autograd::grad does not accumulate
  // through an op that saves its output (exp)
  Tensor z = exp(x * 2);
  Tensor dz = autograd::grad({z}, {x}, {}, std::nullopt, true)[0];
  EXPECT_NEAR(autograd::grad({dz}, {x})[0].item<double>(), 4 * std::exp(3.0), 1e-9);
}

TEST(Engine, GradWithUnusedInputs) {
  Tensor a = from_vector<double>({1}).requires_grad_(), b = from_vector<double>({2}).requires_grad_();
  Tensor y = a * 3;
  EXPECT_THROW(autograd::grad({y}, {a, b}, {}, true), Error);
  std::vector<Tensor> g = autograd::grad({y}, {a, b}, {}, true, false, /*allow_unused=*/true);
  EXPECT_NEAR(g[0].item<double>(), 3, 0);
  EXPECT_FALSE(g[1].defined());
  // gradient with respect to an intermediate
  Tensor h = a * 2;
  Tensor out = h * h;
  EXPECT_NEAR(autograd::grad({out}, {h})[0].item<double>(), 4, 1e-12);
}

int g_failing_backward_runs = 0;
struct FailingBackward : autograd::Function<FailingBackward> {
  static Tensor forward(autograd::AutogradContext&, const Tensor& x) { return x * 1; }
  static std::vector<Tensor> backward(autograd::AutogradContext&, const std::vector<Tensor>&) {
    ++g_failing_backward_runs;
    throw Error("this backward must not run");
  }
};

// autograd::grad runs only what lies on a path to the inputs (PyTorch's exec_info): a branch
// that does not lead to them neither runs its backward nor fires its hooks, and a captured
// leaf's gradient goes through the leaf's own hooks.
TEST(Engine, GradRunsOnlyThePathToItsInputs) {
  Tensor a = from_vector<double>({2}).requires_grad_(), b = from_vector<double>({5}).requires_grad_();
  Tensor side = b * 3;
  int side_hook_calls = 0, b_hook_calls = 0;
  side.register_hook([&](const Tensor& g) { ++side_hook_calls; return g; });
  b.register_hook([&](const Tensor& g) { ++b_hook_calls; return g; });
  // a node whose backward fails, as one that cannot be recorded under create_graph does
  g_failing_backward_runs = 0;
  Tensor y = a * a + FailingBackward::apply(side);
  std::vector<Tensor> g = autograd::grad({y}, {a}, {}, true, /*create_graph=*/true);
  EXPECT_NEAR(g[0].item<double>(), 4, 0);
  EXPECT_EQ(g_failing_backward_runs, 0);
  EXPECT_EQ(side_hook_calls, 0);
  EXPECT_EQ(b_hook_calls, 0);
  EXPECT_FALSE(b.grad().defined());

  // a hook on a captured leaf shapes what grad returns, as it shapes .grad
  a.register_hook([](const Tensor& g) { return g * 10; });
  EXPECT_NEAR(autograd::grad({a * a}, {a})[0].item<double>(), 40, 0);
  // and on a captured intermediate
  Tensor h = a * 2;
  h.register_hook([](const Tensor& g) { return g + 1; });
  EXPECT_NEAR(autograd::grad({h * 3}, {h})[0].item<double>(), 4, 0);
  // backward still runs every branch
  EXPECT_THROW(y.backward(), Error);
  EXPECT_EQ(g_failing_backward_runs, 1);

  // a captured intermediate hands over its gradient without running its own backward: its
  // saved tensors stay for a later backward, and may have been written in place since
  Tensor p = from_vector<double>({1, 2}).requires_grad_(), q = from_vector<double>({3, 4});
  Tensor pq = p * q;
  {
    NoGradGuard no_grad;
    q.add_(1);
  }
  EXPECT_TRUE(all_close(autograd::grad({(pq * 2).sum()}, {pq})[0], {2, 2}, 0, 0));
  Tensor pp = p * p;
  EXPECT_TRUE(all_close(autograd::grad({pp.sum()}, {pp})[0], {1, 1}, 0, 0));
  pp.sum().backward();
  EXPECT_TRUE(all_close(p.grad(), {2, 4}, 0, 0));
  // ... but runs it when it leads to another captured input
  Tensor pp2 = p * p;
  const auto both = autograd::grad({(pp2 * 3).sum()}, {pp2, p});
  EXPECT_TRUE(all_close(both[0], {3, 3}, 0, 0));
  EXPECT_TRUE(all_close(both[1], {6, 12}, 0, 0));
}

TEST(Engine, NoGradGuard) {
  Tensor x = from_vector<double>({1}).requires_grad_();
  {
    NoGradGuard no_grad;
    Tensor y = x * 2;
    EXPECT_FALSE(y.requires_grad());
    {
      EnableGradGuard enable;
      EXPECT_TRUE((x * 2).requires_grad());
    }
    x.mul_(3);  // in-place on a leaf is fine without grad mode
  }
  EXPECT_EQ(x.item<double>(), 3);
  EXPECT_THROW(x.mul_(2), Error);  // ... but not with it
  EXPECT_TRUE(autograd::is_grad_enabled());
}

TEST(Engine, HooksAndRetainGrad) {
  Tensor x = from_vector<double>({1, 2}).requires_grad_();
  Tensor h = x * 3;
  h.retain_grad();
  std::vector<double> seen;
  h.register_hook([&](const Tensor& g) {
    seen = values(g);
    return g * 10;  // replaces the gradient flowing on
  });
  int post = 0;
  x.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    ++post;
    EXPECT_TRUE(leaf.grad().defined());
  });
  x.register_hook([](const Tensor& g) { return g + 1; });
  (h * h).backward(ones({2}, kFloat64));
  EXPECT_EQ(seen, (std::vector<double>{6, 12}));
  EXPECT_TRUE(all_close(x.grad(), {6 * 10 * 3 + 1, 12 * 10 * 3 + 1}, 1e-12, 0));
  EXPECT_EQ(post, 1);
  ASSERT_TRUE(h.grad().defined());
}

TEST(Engine, SavedTensorHooks) {
  int packed = 0, unpacked = 0;
  Tensor x = from_vector<double>({0.5, 1.5}).requires_grad_();
  Tensor y;
  {
    autograd::SavedTensorHooksGuard hooks(
        [&](const Tensor& t) -> std::any {
          ++packed;
          return t.to(kFloat32);  // store a compressed copy
        },
        [&](const std::any& a) {
          ++unpacked;
          return std::any_cast<Tensor>(a).to(kFloat64);
        });
    y = sin(x) * x;
  }
  EXPECT_EQ(packed, 3);  // sin saves x; mul saves both factors
  y.backward(ones({2}, kFloat64));
  EXPECT_EQ(unpacked, 3);
  EXPECT_TRUE(all_close(x.grad(), {std::cos(0.5) * 0.5 + std::sin(0.5), std::cos(1.5) * 1.5 + std::sin(1.5)}, 1e-6, 0));
}

TEST(Engine, InPlaceModificationOfSavedTensorIsDetected) {
  Tensor x = from_vector<double>({1, 2}).requires_grad_();
  Tensor e = exp(x);  // saves its output
  Tensor y = e * 2;
  {
    NoGradGuard no_grad;
    e.add_(1);
  }
  try {
    y.sum().backward();
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("in-place"), std::string::npos) << err.what();
  }
  Tensor w = from_vector<double>({3}).requires_grad_();
  Tensor v = exp(w);  // saves its output: an in-place op on it under autograd raises at backward
  v.add_(1);
  EXPECT_THROW(v.sum().backward(), Error);
}

TEST(Engine, DeepChainDoesNotOverflowTheStack) {
  Tensor x = from_vector<double>({1}).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0;
  y.backward();
  EXPECT_EQ(x.grad().item<double>(), 1.0);
}

TEST(Engine, DeepGraphDroppedWithoutBackwardIsFreedIteratively) {
  // saved inputs and retained graphs hold the chain too: tearing it down must not recurse
  Tensor x = from_vector<double>({1}).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 100000; ++i) y = y * x;
  }
  Tensor z = x;
  for (int i = 0; i < 100000; ++i) z = z * 1.0;
  z.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(x.grad().item<double>(), 1.0);
}

TEST(Engine, SavedTensorsFreedAfterBackward) {
  Tensor x = randn({1000}, kFloat64).requires_grad_();
  int64_t before = cpu_memory_stats().bytes_in_use;
  Tensor y = (exp(x) * x).sum();
  y.backward();
  // only y and x.grad remain alive beyond x: the saved exp(x) and friends are gone
  EXPECT_LE(cpu_memory_stats().bytes_in_use - before, 2 * 8000 + 1024);
}

namespace {
struct Cube : autograd::Function<Cube> {
  static Tensor forward(AutogradContext& ctx, const Tensor& x, double scale) {
    ctx.save_for_backward({x});
    ctx.saved_data["scale"] = scale;
    return x * x * x * scale;
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& g) {
    Tensor x = ctx.saved()[0];
    double scale = std::any_cast<double>(ctx.saved_data["scale"]);
    return {g[0] * x * x * (3 * scale)};
  }
};

struct SortedWithIndex : autograd::Function<SortedWithIndex> {
  static std::vector<Tensor> forward(AutogradContext& ctx, const Tensor& x) {
    Tensor doubled = x * 2;
    Tensor mask = x > 0;
    ctx.mark_non_differentiable({mask});
    return {doubled, mask};
  }
  static std::vector<Tensor> backward(AutogradContext&, const std::vector<Tensor>& g) { return {g[0] * 2}; }
};
}  // namespace

TEST(Engine, CustomFunction) {
  Tensor x = from_vector<double>({1, -2}).requires_grad_();
  Tensor y = Cube::apply(x, 0.5);
  EXPECT_TRUE(all_close(y, {0.5, -4}, 1e-12, 0));
  EXPECT_FALSE(y.is_leaf());
  y.backward(ones({2}, kFloat64));
  EXPECT_TRUE(all_close(x.grad(), {1.5, 6}, 1e-12, 0));
  EXPECT_TRUE(strata::testing::gradcheck([](const std::vector<Tensor>& in) { return Cube::apply(in[0], 2.0); },
                                         {strata::testing::leaf(randn({4}))}));
  std::vector<Tensor> outs = SortedWithIndex::apply(x);
  EXPECT_TRUE(outs[0].requires_grad());
  EXPECT_FALSE(outs[1].requires_grad());
  // no input requires grad: nothing is recorded
  EXPECT_FALSE(Cube::apply(ones({2}), 1.0).requires_grad());
}

namespace {
// Counts the kernels run per op while alive.
struct OpCounter : OpObserver {
  std::map<OpId, int> calls;
  OpCounter() { set_op_observer(this); }
  ~OpCounter() override { set_op_observer(nullptr); }
  void on_begin(OpId op, const KernelCall&) override { ++calls[op]; }
  void on_end(OpId, const KernelCall&) override {}
};
}  // namespace

// Backward computes gradients for the inputs that require them only: the product with a
// constant (x * mask, x @ data, masked_fill's value) is never formed, and the gradients that
// are formed stay right.
TEST(Engine, GradientsOnlyForInputsThatNeedThem) {
  Generator g(5);
  Tensor x = randn({3, 4}, kFloat64, &g).requires_grad_(), c = randn({3, 4}, kFloat64, &g) + 3.0;
  Tensor w = randn({4, 2}, kFloat64, &g).requires_grad_(), data = randn({5, 3}, kFloat64, &g);
  Tensor mask = randn({3, 4}, kFloat64, &g) > 0.0;
  Tensor loss = (x * c).sum() + (x / c).sum() + (c / (x * x + 1.0)).sum() + where(mask, x, c).sum() +
                matmul(data, matmul(x, w)).sum();
  OpCounter counter;
  loss.backward();
  EXPECT_EQ(counter.calls[OpId::matmul], 3);  // not 4: no gradient for `data`
  EXPECT_FALSE(c.grad().defined());
  // x's gradient against float64 formulas: c + 1/c - 2cx/(x^2+1)^2 + mask + (data^T 1) w^T row sums
  std::vector<double> xv = values(x), cv = values(c), mv = values(mask.to(kFloat64)), dv = values(data),
                      wv = values(w), want(12);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      const int k = i * 4 + j;
      double col = 0;
      for (int r = 0; r < 5; ++r) col += dv[r * 3 + i];
      const double q = xv[k] * xv[k] + 1.0;
      want[k] = cv[k] + 1.0 / cv[k] - 2.0 * cv[k] * xv[k] / (q * q) + mv[k] + col * (wv[j * 2] + wv[j * 2 + 1]);
    }
  EXPECT_TRUE(all_close(x.grad(), want, 1e-10, 1e-10));
}

// Backward passes on several threads into one leaf: every gradient arrives (the leaf's
// accumulator is one node, and its mutex orders the additions), as in PyTorch.
TEST(Engine, ConcurrentBackwardIntoOneLeaf) {
  Tensor w = zeros({4}, kFloat64).requires_grad_();
  constexpr int kThreads = 4, kPasses = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kPasses; ++i) (w * 1.0).sum().backward();
    });
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(all_close(w.grad(), std::vector<double>(4, kThreads * kPasses), 0, 0));
}

// queue_callback: callbacks run once the whole graph has run (every leaf's post-accumulate
// hook has fired, every .grad is final), in the order queued, including one queued by another;
// each backward pass has its own; outside a backward it raises.
TEST(Engine, QueuedCallbacksRunAtTheEndOfBackward) {
  Tensor a = full({3}, 2.0, kFloat64).requires_grad_();
  Tensor b = full({3}, 5.0, kFloat64).requires_grad_();
  std::vector<std::string> log;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    log.push_back("a");
    autograd::queue_callback([&] {
      log.push_back("first");
      EXPECT_TRUE(a.grad().defined() && b.grad().defined());  // both leaves are done
      autograd::queue_callback([&] { log.push_back("queued by first"); });
    });
    autograd::queue_callback([&] { log.push_back("second"); });
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) { log.push_back("b"); });
  ((a * b).sum() + (b * b).sum()).backward();
  ASSERT_EQ(log.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(log.begin() + 2, log.end()),
            (std::vector<std::string>{"first", "second", "queued by first"}));
  log.clear();
  (a * 3.0).sum().backward();  // a second pass queues afresh; nothing is left from the first
  EXPECT_EQ(log, (std::vector<std::string>{"a", "first", "second", "queued by first"}));
  EXPECT_TRUE(strata::testing::throws_with([] { autograd::queue_callback([] {}); }, {"no backward pass"}));
}
