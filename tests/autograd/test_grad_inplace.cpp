// In-place ops under autograd (Note [In-place under autograd] in src/autograd/inplace.cpp):
// each op applied to a non-leaf copy of its input, checked by finite differences (float64)
// and through a square for second derivatives; a buffer that joins the graph through copy_;
// and the refusals: a leaf that requires grad. Views, the tensors they look into, retained
// grads and custom Functions' outputs are test_grad_inplace_views.cpp's.
#include <any>

#include "gradcheck.h"
#include "testing.h"

using namespace strata;

namespace {

using Case = strata::testing::GradCase;
using strata::testing::indices;

// x[0] * 1 is a non-leaf that owns its memory, as an activation does
const std::vector<Case>& cases() {
  using V = const std::vector<Tensor>&;
  static const std::vector<Case> c = {
      {"add_", [](V x) { Tensor h = x[0] * 1.0; h.add_(x[1], 2.5); return h; }, {{3, 4}, {4}}},
      {"add_ scalar", [](V x) { Tensor h = x[0] * 1.0; h.add_(3.0); return h * h; }, {{3, 4}}},
      {"sub_", [](V x) { Tensor h = x[0] * 1.0; h.sub_(x[1]); return h * x[0]; }, {{3, 4}, {3, 1}}},
      {"mul_", [](V x) { Tensor h = x[0] * 1.0; h.mul_(x[1]); return h; }, {{3, 4}, {3, 4}}},
      {"mul_ twice", [](V x) { Tensor h = x[0] * 1.0; h.mul_(x[1]).mul_(x[1]); return h; }, {{2, 3}, {3}}},
      {"mul_ self", [](V x) { Tensor h = x[0] * 1.0; h.mul_(h); return h; }, {{2, 3}}},
      {"div_", [](V x) { Tensor h = x[0] * 1.0; h.div_(exp(x[1])); return h; }, {{2, 3}, {2, 3}}},
      {"div_ scalar", [](V x) { Tensor h = x[0] * 1.0; h.div_(4.0); return h; }, {{5}}},
      {"clamp_", [](V x) { Tensor h = x[0] * 1.0; h.clamp_(-0.5, 0.7); return h; }, {{4, 5}}},
      {"relu_", [](V x) { Tensor h = x[0] * 1.0; h.relu_(); return h * x[0]; }, {{4, 5}}},
      {"masked_fill_",
       [](V x) {
         Tensor h = x[0] * 1.0;
         h.masked_fill_(from_vector<bool>({true, false, false, true}, Shape{4}), 2.0);
         return h * x[0];
       },
       {{3, 4}}},
      {"fill_ then add_", [](V x) { Tensor h = x[0] * 1.0; h.fill_(1.5); h.add_(x[1]); return h; }, {{3}, {3}}},
      {"copy_ broadcast", [](V x) { Tensor h = x[0] * 1.0; h.copy_(x[1]); return h * x[0]; }, {{3, 4}, {4}}},
      {"scatter_",
       [](V x) { Tensor h = x[0] * 1.0; scatter_(h, 1, indices({4, 0, 2, 1, 3, 0}, {2, 3}), x[1]); return h; },
       {{3, 5}, {3, 4}}},
      {"scatter_add_",
       [](V x) { Tensor h = x[0] * 1.0; scatter_add_(h, 1, indices({4, 4, 2, 1, 1, 1}, {2, 3}), x[1]); return h; },
       {{3, 5}, {2, 4}}},
      {"index_add_",
       [](V x) { Tensor h = x[0] * 1.0; index_add_(h, 0, indices({1, 1, 0, 2}, {4}), x[1], 2.5); return h; },
       {{3, 5}, {4, 5}}},
      // a residual added in place, as a block's forward does it
      {"residual", [](V x) { Tensor h = matmul(x[0], x[1]); h.add_(x[0]); return tanh(h); }, {{2, 3}, {3, 3}}},
  };
  return c;
}

}  // namespace

TEST(GradInPlace, MatchesFiniteDifferences) {
  strata::testing::check_cases_to_second_order(cases(), 3);
}

TEST(GradInPlace, TheTensorTakesOverTheNewHistory) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor h = x * 2.0;
  auto before = h.grad_fn();
  h.mul_(x);  // h = 2 x^2
  EXPECT_NE(h.grad_fn(), before);
  EXPECT_FALSE(h.is_leaf());
  EXPECT_TRUE(strata::testing::all_close(h, {2, 8, 18}, 0, 0));
  h.sum().backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {4, 8, 12}, 0, 0));  // d(2 x^2) = 4 x
}

// A buffer that does not require grad joins the graph through copy_ and add_, as a preallocated
// output does; the old values get no gradient.
TEST(GradInPlace, BufferJoinsTheGraph) {
  Tensor a = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor buf = zeros({3}, kFloat64);
  buf.copy_(a * 2.0);
  EXPECT_TRUE(buf.requires_grad());
  Tensor acc = ones({3}, kFloat64);
  acc.add_(a);
  (buf * buf + acc).sum().backward();
  EXPECT_TRUE(strata::testing::all_close(a.grad(), {9, 17, 25}, 0, 0));  // 8 a + 1
  // a fill makes the tensor a constant again for the gradient
  Tensor b = a * 3.0;
  b.zero_();
  b.add_(a);
  a.set_grad(Tensor());
  b.sum().backward();
  EXPECT_TRUE(strata::testing::all_close(a.grad(), {1, 1, 1}, 0, 0));
}

// A float16 tensor gets the same values from an in-place op with a float32 operand whether
// autograd records it or not (the operand is cast to float16 first on both paths).
TEST(GradInPlace, SameValuesWithAndWithoutGrad) {
  Generator g(4);
  Tensor x = randn({4096}, {}, &g).to(kFloat16), b = randn({4096}, {}, &g) * 1000.0;
  Tensor plain = x.clone();
  plain.mul_(b);
  Tensor xl = x.clone().requires_grad_();
  Tensor h = xl * 1.0;
  h.mul_(b);
  EXPECT_TRUE(h.requires_grad());
  EXPECT_TRUE(equal(h.detach(), plain));
}

// Saved-tensor hooks keep only what pack returns; an in-place write to the memory they packed
// still raises at backward while that memory lives (an identity pack returns it).
TEST(GradInPlace, WritesAfterAHookPackedTheValueAreCaught) {
  Tensor x = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor h = x * 1.0, y;
  {
    autograd::SavedTensorHooksGuard identity([](const Tensor& t) { return std::any(t); },
                                             [](const std::any& a) { return std::any_cast<Tensor>(a); });
    y = h * h;
  }
  h.mul_(3.0);
  EXPECT_TRUE(strata::testing::throws_with([&] { y.sum().backward(); }, {"modified by an in-place operation",
                                                                          "saved-tensor hook"}));
  // a buffer, written on the fast path, the same
  Tensor w = from_vector<double>({1, 2, 3}).requires_grad_(), buf = ones({3}, kFloat64), z;
  {
    autograd::SavedTensorHooksGuard identity([](const Tensor& t) { return std::any(t); },
                                             [](const std::any& a) { return std::any_cast<Tensor>(a); });
    z = buf * w;
  }
  {
    NoGradGuard no_grad;
    buf.add_(10.0);
  }
  EXPECT_THROW(z.sum().backward(), Error);
}

TEST(GradInPlace, Refusals) {
  using strata::testing::throws_with;
  Tensor w = from_vector<double>({1, 2, 3}).requires_grad_();
  EXPECT_TRUE(throws_with([&] { w.add_(1.0); }, {"[add_]", "leaf tensor that requires grad", "NoGradGuard"}));
  EXPECT_TRUE(throws_with([&] { w.zero_(); }, {"[fill_]", "leaf"}));
  {
    NoGradGuard no_grad;  // an optimizer's update
    w.sub_(from_vector<double>({1, 1, 1}));
  }
  EXPECT_TRUE(strata::testing::all_close(w, {0, 1, 2}, 0, 0));
  Tensor h = w * 1.0;
  Tensor part = h.narrow(0, 1, 2);
  // without grad mode nothing is recorded, and views may be written
  {
    NoGradGuard no_grad;
    part.mul_(3.0);
  }
  EXPECT_TRUE(strata::testing::all_close(h, {0, 3, 6}, 0, 0));
}
