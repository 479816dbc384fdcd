// Fused attention (Note [Fused attention] in src/nn/attention_fused.cpp): the attention and
// attention_backward kernels against a float64 loop reference and against the composed path
// (the same call with set_fused_attention off), in every floating dtype, with and without the
// causal mask, more queries than keys and fewer, a value dim unlike the key dim, blocks of
// fewer rows for long key runs, finite-difference gradients to second order, dropout that drops
// what the composed path drops, results that do not depend on the thread count, and which inputs
// take which path.
#include <cmath>
#include <functional>

#include "gradcheck.h"
#include "nn/attention_internal.h"
#include "nn/attention_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::attention_ref;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::kNegInf;
using strata::testing::Layout;
using strata::testing::leaf;
using strata::testing::Mat;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

// Sets the CPU switch for a scope.
struct FusedScope : F::FusedAttentionGuard {
  explicit FusedScope(bool on) : F::FusedAttentionGuard(DeviceType::CPU, on) {}
};

struct Result {
  Tensor o, dq, dk, dv;
  std::string node;  // the name of o's grad_fn
};

// Attention of q, k, v (copied as leaves of their dtype) and the gradients of <o, g>.
Result run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal, bool fused,
           std::optional<double> scale = std::nullopt) {
  FusedScope scope(fused);
  Tensor lq = q.detach().clone().requires_grad_(), lk = k.detach().clone().requires_grad_();
  Tensor lv = v.detach().clone().requires_grad_();
  Tensor o = F::scaled_dot_product_attention(lq, lk, lv, Tensor(), 0, causal, scale);
  Result r{o.detach(), {}, {}, {}, o.grad_fn() ? o.grad_fn()->name() : ""};
  auto grads = autograd::grad({o}, {lq, lk, lv}, {g.to(o.dtype())});
  r.dq = grads[0], r.dk = grads[1], r.dv = grads[2];
  return r;
}

// Stacks the float64 loop reference of every leading index of (B, H, L, E) tensors.
std::vector<double> reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  std::vector<double> out;
  for (int64_t a = 0; a < q.size(0); ++a)
    for (int64_t b = 0; b < q.size(1); ++b) {
      auto one = [&](const Tensor& t) { return Mat(t.select(0, a).select(0, b).to(kFloat64)); };
      strata::testing::ScoreBias bias;
      if (causal) bias = [](int64_t i, int64_t j) { return j > i ? kNegInf : 0.0; };
      Mat o = attention_ref(one(q), one(k), one(v), scale, bias);
      out.insert(out.end(), o.v.begin(), o.v.end());
    }
  return out;
}

double tolerance(DType t) { return t == kFloat64 ? 1e-12 : t == kFloat32 ? 2e-5 : t == kFloat16 ? 4e-3 : 3e-2; }

}  // namespace

TEST(FusedAttention, MatchesReferenceAndComposedPath) {
  Generator gen(11);
  struct Case {
    int64_t L, S, E, Ev;
  };
  for (Case c : {Case{5, 5, 8, 8}, {7, 3, 8, 5}, {3, 7, 4, 6}, {1, 4, 3, 3}, {130, 130, 16, 16}, {200, 70, 8, 12},
                 {70, 200, 8, 8}})
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})
      for (bool causal : {false, true}) {
        Tensor q = randn({2, 3, c.L, c.E}, kFloat64, &gen).to(t), k = randn({2, 3, c.S, c.E}, kFloat64, &gen).to(t);
        Tensor v = randn({2, 3, c.S, c.Ev}, kFloat64, &gen).to(t), g = randn({2, 3, c.L, c.Ev}, kFloat64, &gen);
        const std::string what = fmt::format("{} L {} S {} E {} Ev {} causal {}", dtype_name(t), c.L, c.S, c.E, c.Ev,
                                             causal);
        Result f = run(q, k, v, g, causal, true);
        EXPECT_EQ(f.node, "attention") << what;
        EXPECT_EQ(f.o.dtype(), t);
        EXPECT_EQ(f.o.shape(), (Shape{2, 3, c.L, c.Ev}));
        const double tol = tolerance(t);
        EXPECT_TRUE(all_close(values(f.o), reference(q, k, v, causal, 1 / std::sqrt(double(c.E))), tol, tol)) << what;
        // gradients against the composed path in float64 on the same (rounded) inputs
        Result w = run(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), g, causal, false);
        EXPECT_NE(w.node, "attention");
        for (auto [got, want, name] : {std::tuple{f.dq, w.dq, "dq"}, {f.dk, w.dk, "dk"}, {f.dv, w.dv, "dv"}}) {
          EXPECT_EQ(got.dtype(), t) << name;
          EXPECT_TRUE(all_close(values(got), values(want), 4 * tol, 4 * tol)) << what << " " << name;
        }
      }
}

// Keys past the last query of a causal problem get zero gradients; an explicit scale is used
// as given.
TEST(FusedAttention, CausalTailAndExplicitScale) {
  Generator gen(12);
  Tensor q = randn({1, 2, 4, 6}, kFloat64, &gen), k = randn({1, 2, 9, 6}, kFloat64, &gen);
  Tensor v = randn({1, 2, 9, 3}, kFloat64, &gen), g = randn({1, 2, 4, 3}, kFloat64, &gen);
  Result f = run(q, k, v, g, true, true, 0.3);
  EXPECT_TRUE(all_close(values(f.o), reference(q, k, v, true, 0.3), 1e-12, 1e-12));
  std::vector<double> dk = values(f.dk), dv = values(f.dv);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 4; j < 9; ++j) {
      for (int64_t e = 0; e < 6; ++e) EXPECT_EQ(dk[(h * 9 + j) * 6 + e], 0.0);
      for (int64_t e = 0; e < 3; ++e) EXPECT_EQ(dv[(h * 9 + j) * 3 + e], 0.0);
    }
  Result w = run(q, k, v, g, true, false, 0.3);
  EXPECT_TRUE(all_close(values(f.dq), values(w.dq), 1e-12, 1e-12));
}

// So many keys that a block holds fewer than 32 queries (kernels/cpu/attention.h), and
// 16-bit inputs on that path.
TEST(FusedAttention, LongKeyRuns) {
  Generator gen(13);
  for (DType t : {kFloat32, kBFloat16}) {
    Tensor q = randn({1, 1, 40, 4}, kFloat64, &gen).to(t), k = randn({1, 1, 17000, 4}, kFloat64, &gen).to(t);
    Tensor v = randn({1, 1, 17000, 2}, kFloat64, &gen).to(t), g = randn({1, 1, 40, 2}, kFloat64, &gen);
    Result f = run(q, k, v, g, false, true);
    Result w = run(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), g, false, false);
    EXPECT_TRUE(all_close(values(f.o), values(w.o), tolerance(t), tolerance(t))) << dtype_name(t);
    EXPECT_TRUE(all_close(values(f.dk), values(w.dk), 4 * tolerance(t), 4 * tolerance(t))) << dtype_name(t);
  }
}

TEST(FusedAttention, GradCheckToSecondOrder) {
  Generator gen(14);
  FusedScope scope(true);
  for (bool causal : {false, true}) {
    Tensor q = leaf(randn({2, 5, 4}, kFloat64, &gen), Layout::Transposed), k = leaf(randn({2, 3, 4}, kFloat64, &gen));
    Tensor v = leaf(randn({2, 3, 2}, kFloat64, &gen), Layout::Sliced);
    auto f = [causal](V in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0, causal); };
    EXPECT_EQ(f({q, k, v}).grad_fn()->name(), "attention");
    EXPECT_TRUE(gradcheck(f, {q, k, v})) << causal;
    EXPECT_TRUE(gradgradcheck(f, {q, k, v})) << causal;
  }
}

TEST(FusedAttention, SameResultsOnAnyThreadCount) {
  Generator gen(15);
  Tensor q = randn({3, 2, 150, 16}, kFloat32, &gen), k = randn({3, 2, 150, 16}, kFloat32, &gen);
  Tensor v = randn({3, 2, 150, 16}, kFloat32, &gen), g = randn({3, 2, 150, 16}, kFloat32, &gen);
  const int threads = get_num_threads();
  set_num_threads(1);
  Result one = run(q, k, v, g, true, true);
  set_num_threads(2);
  Result two = run(q, k, v, g, true, true);
  set_num_threads(threads);
  for (auto [a, b] : {std::pair{one.o, two.o}, {one.dq, two.dq}, {one.dk, two.dk}, {one.dv, two.dv}})
    EXPECT_EQ(values(a), values(b));
}

// Dropout drops the weights functional::dropout drops with the same generator (so the fused and
// composed paths train alike, element counts not a multiple of 4 included) and draws as much
// from it; its gradients hold to second order with the draw fixed.
TEST(FusedAttention, DropoutMatchesComposedPath) {
  Generator gen(17);
  for (DType t : {kFloat64, kFloat32})
    for (bool causal : {false, true}) {
      Tensor q = randn({2, 3, 5, 4}, kFloat64, &gen).to(t), k = randn({2, 3, 7, 4}, kFloat64, &gen).to(t);
      Tensor v = randn({2, 3, 7, 3}, kFloat64, &gen).to(t), g = randn({2, 3, 5, 3}, kFloat64, &gen).to(t);
      auto run_with = [&](bool fused, Generator& draw) {
        FusedScope scope(fused);
        Tensor a = q.clone().requires_grad_(), b = k.clone().requires_grad_(), c = v.clone().requires_grad_();
        Tensor o = F::scaled_dot_product_attention(a, b, c, Tensor(), 0.4, causal, std::nullopt, &draw);
        EXPECT_EQ(o.grad_fn()->name() == "attention", fused);
        std::vector<Tensor> out = autograd::grad({o}, {a, b, c}, {g});
        out.insert(out.begin(), o.detach());
        return out;
      };
      Generator g1(99), g2(99);
      std::vector<Tensor> f = run_with(true, g1), w = run_with(false, g2);
      const double tol = t == kFloat64 ? 1e-12 : 2e-5;
      for (size_t i = 0; i < f.size(); ++i)
        EXPECT_TRUE(all_close(values(f[i]), values(w[i]), tol, tol)) << dtype_name(t) << " " << causal << " " << i;
      EXPECT_EQ(values(rand({4}, kFloat64, &g1)), values(rand({4}, kFloat64, &g2)));  // the same amount drawn
      size_t zeros = 0;  // and some weights were dropped: outputs differ from no dropout
      Result plain = run(q, k, v, g, causal, true);
      std::vector<double> a = values(f[0]), b = values(plain.o);
      for (size_t i = 0; i < a.size(); ++i) zeros += std::abs(a[i] - b[i]) > 1e-6;
      EXPECT_GT(zeros, a.size() / 4);
    }
  FusedScope scope(true);
  Tensor q = leaf(randn({1, 5, 3}, kFloat64, &gen)), k = leaf(randn({1, 6, 3}, kFloat64, &gen));
  Tensor v = leaf(randn({1, 6, 2}, kFloat64, &gen));
  auto f = [](V in) {
    Generator draw(5);  // the same weights dropped at every evaluation
    return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.3, true, std::nullopt, &draw);
  };
  EXPECT_TRUE(gradcheck(f, {q, k, v}));
  EXPECT_TRUE(gradgradcheck(f, {q, k, v}));
}

// What takes the composed path: masks, a dropout rate of 1, mixed dtypes, empty dims and the
// switch (broadcast batch dims take the fused one); an in-place write to a saved input is caught
// at backward.
TEST(FusedAttention, WhichPathAndSavedInputs) {
  Generator gen(16);
  Tensor q = randn({2, 4, 8}, kFloat32, &gen).requires_grad_(), k = randn({2, 6, 8}, kFloat32, &gen);
  Tensor v = randn({2, 6, 8}, kFloat32, &gen);
  auto node = [](const Tensor& o) { return o.grad_fn() ? o.grad_fn()->name() : std::string(); };
  FusedScope scope(true);
  EXPECT_TRUE(F::fused_attention_enabled(DeviceType::CPU));
  EXPECT_FALSE(F::fused_attention_enabled(DeviceType::CUDA));  // until its kernels have run on a GPU
  EXPECT_EQ(node(F::scaled_dot_product_attention(q, k, v)), "attention");
  EXPECT_NE(node(F::scaled_dot_product_attention(q, k, v, ones({4, 6}, kBool))), "attention");
  EXPECT_EQ(node(F::scaled_dot_product_attention(q, k, v, Tensor(), 0.5)), "attention");  // dropout rides along
  EXPECT_NE(node(F::scaled_dot_product_attention(q, k, v, Tensor(), 1.0)), "attention");  // all dropped: no draw
  EXPECT_EQ(node(F::scaled_dot_product_attention(q, k.select(0, 0), v.select(0, 0))), "attention");
  Tensor none = F::scaled_dot_product_attention(q, k.narrow(1, 0, 0), v.narrow(1, 0, 0));
  EXPECT_EQ(none.shape(), (Shape{2, 4, 8}));
  EXPECT_EQ(values(none), std::vector<double>(64, 0.0));
  {
    FusedScope off(false);
    EXPECT_NE(node(F::scaled_dot_product_attention(q, k, v)), "attention");
  }
  Tensor kl = k.clone().requires_grad_();
  Tensor o = F::scaled_dot_product_attention(q, kl, v);
  {
    NoGradGuard no_grad;
    kl.add_(1);
  }
  EXPECT_THROW(o.sum().backward(), Error);
}

// Strided inputs: the heads of one qkv projection ((batch, T, 3 width) split and viewed as
// (batch, heads, T, dim)), an incoming gradient of the same layout, foldable and unfoldable batch
// dims, keys shared by every head (a stride-0 head dim), and layouts the kernels cannot read
// (transposed columns, rows a stride of 0 apart), which are copied. Outputs and gradients are
// laid out as their inputs: for such heads, o.transpose(1, 2) and dq.transpose(1, 2) are
// contiguous, so the projection's reshape needs no copy.
TEST(FusedAttention, StridedInputs) {
  Generator gen(18);
  const int64_t B = 2, T = 37, H = 3, D = 8, C = H * D;
  for (DType t : {kFloat32, kFloat64, kBFloat16})
    for (bool causal : {false, true}) {
      const std::string what = fmt::format("{} causal {}", dtype_name(t), causal);
      Tensor qkv = randn({B, T, 3 * C}, kFloat64, &gen).to(t), g = randn({B, T, H, D}, kFloat64, &gen);
      auto heads = [&](const Tensor& x, int64_t i) { return x.narrow(2, i * C, C).view({B, T, H, D}).transpose(1, 2); };
      auto attend = [&](bool fused, const Tensor& x) {
        FusedScope scope(fused);
        Tensor leaf_x = x.detach().clone().requires_grad_();
        Tensor o = F::scaled_dot_product_attention(heads(leaf_x, 0), heads(leaf_x, 1), heads(leaf_x, 2), Tensor(), 0,
                                                   causal);
        EXPECT_EQ(o.grad_fn()->name() == "attention", fused) << what;
        Tensor grad = autograd::grad({o}, {leaf_x}, {g.to(o.dtype()).transpose(1, 2)})[0];
        return std::pair{o.detach(), grad};
      };
      auto [o, dqkv] = attend(true, qkv);
      EXPECT_TRUE(o.transpose(1, 2).is_contiguous()) << what << " strides " << fmt::format("{}", o.strides());
      const double tol = tolerance(t);
      EXPECT_TRUE(all_close(values(o), reference(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), causal,
                                                 1 / std::sqrt(double(D))),
                            tol, tol))
          << what;
      auto [wo, wdqkv] = attend(false, qkv.to(kFloat64));
      EXPECT_TRUE(all_close(values(dqkv), values(wdqkv), 4 * tol, 4 * tol)) << what;

      // the gradients of strided heads, read from the node itself, are laid out as the heads
      FusedScope scope(true);
      Tensor leaf_x = qkv.detach().clone().requires_grad_();
      Tensor q = heads(leaf_x, 0), k = heads(leaf_x, 1), v = heads(leaf_x, 2);
      Tensor out = F::scaled_dot_product_attention(q, k, v, Tensor(), 0, causal);
      std::vector<Tensor> grads = autograd::grad({out}, {q, k, v}, {g.to(t).transpose(1, 2)});
      for (const Tensor& grad : grads) EXPECT_TRUE(grad.transpose(1, 2).is_contiguous()) << what;
    }

  // batch dims: three that fold into one, three that fold into two, three that do not fold
  // (copied), keys and values shared by the heads, columns not adjacent and overlapping rows
  // (both copied); each against the float64 loop reference and the composed path, its views
  // taken of leaves so that the kernels see them
  using View = std::function<Tensor(const Tensor&)>;
  struct Case {
    Shape q, k, v;
    View qv, kv, vv;
    const char* name;
  };
  const View same = [](const Tensor& x) { return x; };
  const View fold2 = [](const Tensor& x) { return x.permute({1, 2, 0, 3, 4}); };  // dims 0 and 2 fold, 1 apart
  const View fold3 = [](const Tensor& x) { return x.permute({1, 0, 2, 3, 4}); };  // none fold
  const View to4 = [](const Tensor& x) { return x.reshape({2, 6, x.size(-2), x.size(-1)}); };
  const Shape q5{2, 3, 2, 9, 4}, k5{2, 3, 2, 11, 4}, v5{2, 3, 2, 11, 5};
  const Case cases[] = {
      {q5, k5, v5, same, same, same, "contiguous 5-d"},
      {q5, k5, v5, fold2, fold2, fold2, "two groups"},
      {q5, k5, v5, fold3, fold3, fold3, "unfoldable"},
      {q5, {2, 1, 11, 4}, {2, 1, 11, 5}, to4, [](const Tensor& x) { return x.expand({2, 6, 11, 4}); },
       [](const Tensor& x) { return x.expand({2, 6, 11, 5}); }, "shared keys"},
      {q5, {2, 6, 4, 11}, v5, to4, [](const Tensor& x) { return x.transpose(-2, -1); }, to4, "transposed keys"},
      {q5, {2, 6, 1, 4}, v5, to4, [](const Tensor& x) { return x.expand({2, 6, 11, 4}); }, to4, "repeated key rows"},
  };
  for (const Case& c : cases)
    for (bool causal : {false, true}) {
      const std::string what = fmt::format("{} causal {}", c.name, causal);
      const Tensor qb = randn(c.q, kFloat64, &gen), kb = randn(c.k, kFloat64, &gen), vb = randn(c.v, kFloat64, &gen);
      auto attend = [&](bool fused) {
        FusedScope scope(fused);
        Tensor lq = qb.clone().requires_grad_(), lk = kb.clone().requires_grad_(), lv = vb.clone().requires_grad_();
        Tensor o = F::scaled_dot_product_attention(c.qv(lq), c.kv(lk), c.vv(lv), Tensor(), 0, causal);
        EXPECT_EQ(o.grad_fn()->name() == "attention", fused) << what;
        std::vector<Tensor> out = autograd::grad({(o * o).sum()}, {lq, lk, lv});
        out.insert(out.begin(), o.detach());
        return out;
      };
      std::vector<Tensor> f = attend(true), w = attend(false);
      auto flat = [](const Tensor& x) { return x.reshape({-1, x.size(-3), x.size(-2), x.size(-1)}); };
      EXPECT_TRUE(all_close(values(f[0]), reference(flat(c.qv(qb)), flat(c.kv(kb)), flat(c.vv(vb)), causal, 0.5),
                            1e-12, 1e-12))
          << what;
      for (size_t i = 0; i < f.size(); ++i)
        EXPECT_TRUE(all_close(values(f[i]), values(w[i]), 1e-12, 1e-12)) << what << " output " << i;
    }
}

// Batch dims that broadcast: keys and values shared by every head (grouped as (2, 1)) or by
// everything (no batch dims), against the composed path, gradients summed over the broadcast;
// dropout draws over the broadcast weights, as the composed path's does.
TEST(FusedAttention, BroadcastBatchDims) {
  Generator gen(19);
  struct Case {
    Shape q, k, v;
  };
  for (const Case& c : {Case{{2, 3, 6, 4}, {2, 1, 7, 4}, {7, 5}}, Case{{3, 6, 4}, {1, 7, 4}, {3, 7, 5}},
                        Case{{1, 3, 6, 4}, {2, 1, 7, 4}, {2, 3, 7, 5}}})
    for (double rate : {0.0, 0.3}) {
      const bool causal = rate > 0;
      const std::string what = fmt::format("q {} k {} v {} causal {} dropout {}", c.q, c.k, c.v, causal, rate);
      const Tensor q = randn(c.q, kFloat64, &gen), k = randn(c.k, kFloat64, &gen), v = randn(c.v, kFloat64, &gen);
      auto attend = [&](bool fused) {
        FusedScope scope(fused);
        Generator draw(21);
        Tensor lq = q.clone().requires_grad_(), lk = k.clone().requires_grad_(), lv = v.clone().requires_grad_();
        Tensor o = F::scaled_dot_product_attention(lq, lk, lv, Tensor(), rate, causal, std::nullopt, &draw);
        EXPECT_EQ(o.grad_fn()->name() == "attention", fused) << what;
        std::vector<Tensor> out = autograd::grad({(o * o).sum()}, {lq, lk, lv});
        out.insert(out.begin(), o.detach());
        return out;
      };
      std::vector<Tensor> f = attend(true), w = attend(false);
      for (size_t i = 0; i < f.size(); ++i) {
        EXPECT_EQ(f[i].shape(), w[i].shape()) << what << " output " << i;
        EXPECT_TRUE(all_close(values(f[i]), values(w[i]), 1e-12, 1e-12)) << what << " output " << i;
      }
    }
}

// The kernels index every tensor by q's problem count and k's rows: run_kernel (public, for
// extensions) refuses tensors whose sizes disagree rather than reading past one.
TEST(FusedAttention, KernelRefusesMismatchedSizes) {
  const nn::detail::AttentionParams p{0.5};
  const Tensor q = randn({2, 3, 5, 8}), k = randn({2, 3, 7, 8}), v = randn({2, 3, 7, 4});
  auto forward = [&](const Tensor& key, const Tensor& value, const Shape& o_shape, int64_t lse_rows) {
    std::vector<Tensor> out = {empty(o_shape), empty({lse_rows})};
    const std::vector<Tensor> in = {q, key, value};
    run_kernel(OpId::attention, kFloat32, KernelCall{in, out, &p});
    return out[0];
  };
  EXPECT_EQ(forward(k, v, {2, 3, 5, 4}, 30).shape(), (Shape{2, 3, 5, 4}));
  auto refused = [](auto f) { return throws_with(f, {"[attention]", "same batch dims", "[2, 3, 5, 8]"}); };
  EXPECT_TRUE(refused([&] { forward(randn({1, 3, 7, 8}), randn({1, 3, 7, 4}), {2, 3, 5, 4}, 30); }));
  EXPECT_TRUE(refused([&] { forward(k, randn({2, 3, 6, 4}), {2, 3, 5, 4}, 30); }));
  EXPECT_TRUE(refused([&] { forward(randn({2, 3, 7, 6}), v, {2, 3, 5, 4}, 30); }));
  EXPECT_TRUE(refused([&] { forward(k, v, {2, 3, 5, 4}, 29); }));
  EXPECT_TRUE(refused([&] { forward(k, v, {2, 3, 5, 8}, 30); }));
  // the backward's gradients match their inputs' shapes
  const Tensor o = forward(k, v, {2, 3, 5, 4}, 30), lse = empty({30});
  std::vector<Tensor> grads = {empty(q.shape()), empty(k.shape()), empty({2, 3, 7, 5})};
  const std::vector<Tensor> bin = {q, k, v, o, randn(o.shape()), lse};
  EXPECT_TRUE(throws_with([&] { run_kernel(OpId::attention_backward, kFloat32, KernelCall{bin, grads, &p}); },
                          {"[attention_backward]", "same batch dims"}));
}
