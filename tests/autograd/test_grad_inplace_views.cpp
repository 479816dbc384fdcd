// In-place ops under autograd on views and on tensors that views look into (Note [Views under
// autograd] in src/autograd/views.cpp): finite differences and second derivatives in float64
// for writes through views of every kind, the histories the base and its views take, what
// stays refused, and that no tensor outlives its last handle.
#include <memory>
#include <thread>

#include "gradcheck.h"
#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::autograd::AutogradContext;

namespace {

using Case = strata::testing::GradCase;
using strata::testing::indices;

const std::vector<Case>& cases() {
  using V = const std::vector<Tensor>&;
  static const std::vector<Case> c = {
      {"narrow mul_", [](V x) { Tensor h = x[0] * 1.0; h.narrow(1, 1, 2).mul_(x[1]); return h; }, {{3, 4}, {3, 2}}},
      {"rows of a buffer",
       [](V x) {
         Tensor buf = zeros({3, 4}, kFloat64);
         for (int64_t i = 0; i < 3; ++i) buf.select(0, i).copy_(x[0][i] * x[1]);
         return buf * x[0];
       },
       {{3, 4}, {4}}},
      {"a view of a view, both temporaries",
       [](V x) { Tensor h = x[0] * 1.0; h.select(0, 1).narrow(0, 1, 2).add_(x[1]); return h * h; },
       {{3, 4}, {2}}},
      {"the base written while a view lives",
       [](V x) { Tensor h = x[0] * 1.0; Tensor v = h[0]; h.mul_(x[1]); return v * 2.0; }, {{3, 4}, {4}}},
      {"a view sees a write through another",
       [](V x) {
         Tensor h = x[0] * 1.0;
         Tensor a = h.narrow(1, 0, 3), b = h.narrow(1, 2, 2);
         b.mul_(x[1]);
         return a * a;
       },
       {{3, 4}, {3, 2}}},
      {"transposed view", [](V x) { Tensor h = x[0] * 1.0; h.t().narrow(0, 1, 1).add_(x[1]); return h; },
       {{3, 4}, {3}}},
      {"strided slice div_",
       [](V x) { Tensor h = x[0] * 1.0; h.slice(1, 0, 5, 2).div_(exp(x[1])); return h * x[0]; }, {{2, 5}, {2, 3}}},
      {"channels-last base",
       [](V x) {
         Tensor h = (x[0] * 1.0).to(MemoryFormat::ChannelsLast);
         h.narrow(1, 1, 2).mul_(x[1]);
         return h;
       },
       {{2, 3, 2, 2}, {2, 1, 2, 2}}},
      {"fill_ on a view", [](V x) { Tensor h = x[0] * 1.0; h.narrow(0, 0, 1).fill_(2.0); return h * x[0]; },
       {{3, 4}}},
      {"relu_ on a column", [](V x) { Tensor h = x[0] * 1.0; h.select(1, 2).relu_(); return h * h; }, {{3, 4}}},
      {"a view made before its base needed grad",
       [](V x) {
         Tensor buf = zeros({2, 3}, kFloat64);
         Tensor second = buf.select(0, 1);
         buf.select(0, 0).copy_(x[0]);
         second.add_(x[0] * x[0]);
         return buf;
       },
       {{3}}},
      {"scatter_ into a view",
       [](V x) {
         Tensor h = x[0] * 1.0, rows = h.narrow(0, 1, 2);
         scatter_(rows, 1, indices({4, 0, 2, 1, 3, 0}, {2, 3}), x[1]);
         return h;
       },
       {{3, 5}, {2, 4}}},
      {"a view made with grad mode off",
       [](V x) {
         Tensor h = x[0] * 1.0, part;
         {
           NoGradGuard no_grad;
           part = h.narrow(0, 1, 2);
         }
         part.mul_(x[1]);
         return h * h;
       },
       {{3, 4}, {2, 4}}},
      {"another view as the operand",
       [](V x) { Tensor h = x[0] * 1.0; h.narrow(1, 0, 2).add_(h.narrow(1, 2, 2)); return h * x[0]; }, {{2, 4}}},
      {"a running sum over rows",
       [](V x) {
         Tensor h = x[0] * 1.0;
         for (int64_t t = 1; t < 4; ++t) h[t].add_(h[t - 1]);
         return h * x[0];
       },
       {{4, 3}}},
      {"a row times another", [](V x) { Tensor h = x[0] * 1.0; h[0].mul_(h[1]); return h; }, {{3, 4}}},
      {"a row times itself, two handles", [](V x) { Tensor h = x[0] * 1.0; h[1].mul_(h[1]); return h; }, {{3, 4}}},
      {"the base less its first row", [](V x) { Tensor h = x[0] * 1.0; h.sub_(h[0]); return h * x[0]; }, {{3, 4}}},
      {"a part of split", [](V x) { Tensor h = x[0] * 1.0; split(h, 2, 0)[0].mul_(x[1]); return h; }, {{4, 3}, {2, 3}}},
      {"a part of chunk along columns",
       [](V x) {
         Tensor h = x[0] * 1.0;
         auto parts = chunk(h, 2, 1);
         parts[1].add_(x[1]);
         return h * parts[0].sum();
       },
       {{3, 4}, {3, 2}}},
      {"an expanded view of a written base",
       [](V x) {
         Tensor h = x[0] * 1.0;
         Tensor rows = h.unsqueeze(0).expand({3, 4});
         h.mul_(x[0]);
         return rows * 2.0;
       },
       {{4}}},
      {"reshaped view", [](V x) { Tensor h = x[0] * 1.0; h.view({12}).narrow(0, 3, 4).mul_(x[1]); return h; },
       {{3, 4}, {4}}},
  };
  return c;
}

}  // namespace

TEST(GradInPlaceViews, MatchesFiniteDifferences) {
  strata::testing::check_cases_to_second_order(cases(), 5);
}

// h = 2x, then h[1:] *= x[:2]: h = (2 x0, 2 x1 x0, 2 x2 x1), whose sum has the gradient
// (2 + 2 x1, 2 x0 + 2 x2, 2 x1).
TEST(GradInPlaceViews, TheBaseTakesTheWrite) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor h = x * 2.0;
  Tensor tail = h.narrow(0, 1, 2);
  tail.mul_(x.narrow(0, 0, 2));
  EXPECT_EQ(h.grad_fn()->name(), "copy_slices");
  EXPECT_EQ(tail.grad_fn()->name(), "as_strided");
  EXPECT_TRUE(all_close(h, {2, 4, 12}, 0, 0));
  h.sum().backward(Tensor(), true);
  EXPECT_TRUE(all_close(x.grad(), {6, 8, 4}, 0, 0));
  x.set_grad(Tensor());
  tail.sum().backward();  // the view's own history reaches x through the base's
  EXPECT_TRUE(all_close(x.grad(), {4, 8, 4}, 0, 0));
}

// A view whose base was written in place rebuilds its history, whatever the grad mode of the
// query, and keeps retain_grad; a view that is a leaf of its own stays one.
TEST(GradInPlaceViews, ViewsRebuildTheirHistory) {
  Tensor x = from_vector<double>({1, 2, 3, 4}).requires_grad_();
  Tensor h = (x * 1.0).view({2, 2});
  Tensor row = h[1];
  row.retain_grad();
  auto before = row.grad_fn();
  h.mul_(3.0);
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(row.requires_grad());
    EXPECT_NE(row.grad_fn(), before);
  }
  EXPECT_TRUE(all_close(row, {9, 12}, 0, 0));
  (row * row).sum().backward();
  EXPECT_TRUE(all_close(row.grad(), {18, 24}, 0, 0));
  EXPECT_TRUE(all_close(x.grad(), {0, 0, 54, 72}, 0, 0));  // d(9 x^2) = 18 x

  Tensor buf = zeros({3}, kFloat64);
  Tensor own = buf.narrow(0, 0, 2);
  own.requires_grad_();
  buf.narrow(0, 2, 1).copy_(x.narrow(0, 0, 1));
  EXPECT_TRUE(own.is_leaf());
  EXPECT_TRUE(own.requires_grad());
}

// PyTorch refuses an in-place op under autograd on a view made with grad mode off; its
// gradient is as right as any other's, and strata takes it. The view keeps no graph alive.
TEST(GradInPlaceViews, AViewMadeWithGradModeOff) {
  Tensor w = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor h = w * 1.0;
  Tensor tail;
  {
    NoGradGuard no_grad;
    tail = h.narrow(0, 1, 2);
  }
  EXPECT_FALSE(tail.requires_grad());
  tail.mul_(w.narrow(0, 0, 2));  // h = (w0, w1 w0, w2 w1)
  EXPECT_TRUE(tail.requires_grad());
  h.sum().backward();
  EXPECT_TRUE(all_close(w.grad(), {3, 4, 2}, 0, 0));

  // written with a constant: nothing in the op requires grad, but the tensor it views does
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor g = x * 1.0, head;
  {
    NoGradGuard no_grad;
    head = g.narrow(0, 0, 1);
  }
  head.mul_(5.0);
  g.sum().backward();
  EXPECT_TRUE(all_close(x.grad(), {5, 1, 1}, 0, 0));

  // read with grad mode on after its base was written under autograd: it has the new values
  // and no history of them, so it raises, as in PyTorch; with grad mode off it is a constant
  Tensor z = x * 1.0, early;
  {
    NoGradGuard no_grad;
    early = z.narrow(0, 0, 2);
  }
  z.mul_(x);
  EXPECT_TRUE(throws_with([&] { (early * 3.0).sum(); }, {"grad mode off", "modified in place", "take it again"}));
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(all_close(early * 1.0, {1, 4}, 0, 0));
  }

  std::weak_ptr<TensorImpl> graph_holder;
  Tensor kept;
  {
    Tensor y = w * 2.0;
    graph_holder = y.impl_ptr();
    NoGradGuard no_grad;
    kept = y.narrow(0, 0, 1);
  }
  EXPECT_TRUE(graph_holder.expired());
  EXPECT_TRUE(all_close(kept, {2}, 0, 0));
}

// A tensor that retains its grad goes on retaining it for its value after an in-place op,
// as in PyTorch, whether written itself, through a view, or as a view whose base was written.
TEST(GradInPlaceViews, RetainedGradsFollowTheWrite) {
  Tensor x = from_vector<double>({1, 2, 3, 4}).requires_grad_();
  Tensor h = x * 1.0;
  h.retain_grad();
  h.mul_(3.0);
  h.narrow(0, 0, 2).mul_(2.0);
  (h * h).sum().backward();
  EXPECT_TRUE(all_close(h.grad(), {12, 24, 18, 24}, 0, 0));  // 2 h, h = (6, 12, 9, 12)
  EXPECT_TRUE(all_close(x.grad(), {72, 144, 54, 72}, 0, 0));

  Tensor b = (x * 1.0).view({2, 2});
  Tensor row = b[0];
  row.retain_grad();
  Tensor before = row * 2.0;
  b.mul_(3.0);
  Tensor after = row * 5.0;
  (before + after).sum().backward();
  EXPECT_TRUE(all_close(row.grad(), {5, 5}, 0, 0));  // of the value after the write alone
}

namespace {
struct FirstTwo : autograd::Function<FirstTwo> {  // a view of its input, with its own backward
  static Tensor forward(AutogradContext&, const Tensor& x) { return x.narrow(0, 0, 2); }
  static std::vector<Tensor> backward(AutogradContext&, const std::vector<Tensor>& g) {
    return {cat({g[0], zeros({1}, kFloat64)}, 0)};
  }
};
struct Same : autograd::Function<Same> {  // its input itself
  static Tensor forward(AutogradContext&, const Tensor& x) { return x; }
  static std::vector<Tensor> backward(AutogradContext&, const std::vector<Tensor>& g) { return {g[0]}; }
};
struct FromSavedBuffer : autograd::Function<FromSavedBuffer> {  // a view of a buffer it saves
  static Tensor forward(AutogradContext& ctx, const Tensor& x) {
    Tensor buffer = x * 2.0;
    ctx.save_for_backward({buffer});
    return buffer.narrow(0, 0, 3);
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& g) {
    return {g[0] * ctx.saved()[0] * 0.0 + g[0] * 2.0};
  }
};
}  // namespace

// An op's output that shares memory with its input but has a history of its own cannot take
// an in-place op under autograd (the input's history would miss it), as in PyTorch; one that
// shares memory with a value it saved takes it, and its backward raises.
TEST(GradInPlaceViews, CustomFunctionOutputs) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor h = x * 1.0;
  Tensor two = FirstTwo::apply(h);
  EXPECT_TRUE(throws_with([&] { two.mul_(2.0); }, {"[mul_]", "shares memory with the op's input", "clone()"}));
  EXPECT_TRUE(throws_with([&] { two.narrow(0, 0, 1).zero_(); }, {"[fill_]", "shares memory with the op's input"}));
  Tensor same = Same::apply(h);
  EXPECT_TRUE(throws_with([&] { same.add_(x); }, {"[add_]", "shares memory"}));
  EXPECT_TRUE(all_close(h, {1, 2, 3}, 0, 0));
  Tensor copy = two.clone();
  copy.mul_(2.0);
  copy.sum().backward();
  EXPECT_TRUE(all_close(x.grad(), {2, 2, 0}, 0, 0));

  Tensor y = FromSavedBuffer::apply(x);
  y.add_(x);
  EXPECT_TRUE(throws_with([&] { y.sum().backward(); }, {"modified by an in-place operation"}));

  // the input written after the output was made: the output's history is for the old values
  Tensor w = from_vector<double>({10, 20, 30}).requires_grad_();
  h.add_(w);
  EXPECT_TRUE(throws_with([&] { two.sum(); }, {"custom Function", "modified in place", "clone()"}));
  EXPECT_TRUE(throws_with([&] { (same * 2.0).sum(); }, {"custom Function"}));
  EXPECT_TRUE(all_close(copy.detach(), {2, 4}, 0, 0));  // a clone taken before is its own
}

// Other tensors that share the memory: a detached alias sees the write and takes no part; a
// value saved for backward raises there, as in PyTorch.
TEST(GradInPlaceViews, AliasesAndSavedValues) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor h = x * 1.0;
  Tensor alias = h.detach();
  h.add_(x);
  EXPECT_TRUE(all_close(alias, {2, 4, 6}, 0, 0));
  EXPECT_FALSE(alias.requires_grad());
  h.sum().backward();
  EXPECT_TRUE(all_close(x.grad(), {2, 2, 2}, 0, 0));

  // a detached alias as the operand is a constant with the old values, as in PyTorch
  Tensor a = x * 1.0;
  a.add_(a.detach());
  Tensor m = x * 1.0;
  m.mul_(m.detach());
  x.set_grad(Tensor());
  (a + m).sum().backward();
  EXPECT_TRUE(all_close(x.grad(), {2, 3, 4}, 0, 0));  // 1 from a, x from m

  Tensor e = exp(x * 1.0);  // saves its output
  e.narrow(0, 0, 1).add_(1.0);
  EXPECT_TRUE(throws_with([&] { e.sum().backward(); }, {"modified by an in-place operation"}));
}

TEST(GradInPlaceViews, Refusals) {
  Tensor w = from_vector<double>({1, 2, 3}).requires_grad_();
  EXPECT_TRUE(
      throws_with([&] { w.narrow(0, 0, 2).mul_(2.0); }, {"[mul_]", "view of a leaf tensor that requires grad"}));
  // a view made before its base, a leaf, came to require grad
  Tensor leaf_later = zeros({3}, kFloat64);
  Tensor head = leaf_later.narrow(0, 0, 1);
  leaf_later.requires_grad_();
  EXPECT_TRUE(throws_with([&] { head.mul_(2.0); }, {"[mul_]", "view of a leaf tensor that requires grad"}));
  // a base that does not fill its memory densely (rows 4 apart, 2 long)
  std::vector<double> memory(12, 0.0);
  Tensor sparse_rows = from_blob(memory.data(), {3, 2}, kFloat64, {}, Strides{4, 1});
  EXPECT_TRUE(throws_with([&] { sparse_rows.select(1, 0).copy_(w); }, {"[copy_]", "densely", "clone()"}));
  // nothing was written by any refused op
  for (double v : memory) EXPECT_EQ(v, 0.0);
  EXPECT_TRUE(all_close(leaf_later, {0, 0, 0}, 0, 0));
}

// Threads that use a view whose base was written rebuild its history once, and each gets
// the gradient through the new one.
TEST(GradInPlaceViews, ThreadsAskingAStaleView) {
  Tensor x = from_vector<double>({1, 2, 3, 4}).requires_grad_();
  for (int trial = 0; trial < 20; ++trial) {
    Tensor h = x * 1.0;
    Tensor v = h.narrow(0, 0, 2);
    h.mul_(2.0);
    std::vector<std::vector<double>> got(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < got.size(); ++t)
      threads.emplace_back([&, t] {
        got[t] = strata::testing::values(autograd::grad({(v * 1.0).sum()}, {x}, {}, true)[0]);
      });
    for (std::thread& t : threads) t.join();
    for (const auto& g : got) EXPECT_EQ(g, (std::vector<double>{2, 2, 0, 0}));
  }
}

// A view holds its base; the graph of a write through a view holds neither beyond their handles.
TEST(GradInPlaceViews, NothingOutlivesItsHandles) {
  std::weak_ptr<Storage> memory;
  std::weak_ptr<TensorImpl> base;
  {
    Tensor x = from_vector<double>({1, 2, 3, 4}).requires_grad_();
    Tensor h = x * 1.0;
    memory = h.storage();
    base = h.impl_ptr();
    Tensor v = h.narrow(0, 1, 2);
    v.mul_(x.narrow(0, 0, 2));  // its backward keeps a copy of v's old values
    Tensor other = h.narrow(0, 0, 2);
    other.relu_();
    (h * v.sum()).sum().backward();
  }
  EXPECT_TRUE(memory.expired());
  EXPECT_TRUE(base.expired());
}
