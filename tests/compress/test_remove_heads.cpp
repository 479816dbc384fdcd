// Removing attention heads: the attention with heads cut out against the same weights with those
// heads masked (mask_heads, itself checked against attention written out in test_heads.cpp), in
// float64 to 1e-12, through the fused and the composed attention, every projection layout, a
// TransformerEncoderLayer, finite-difference gradients, masks cut with the weights, and bad input.
#include <algorithm>
#include <cmath>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

nn::MultiheadAttentionOptions seeded(nn::MultiheadAttentionOptions o, Generator* g) {
  o.generator = g;
  return o;
}

// Two float64 copies of one attention: the first gets `gone` masked, the second removed.
struct Pair {
  Generator gen;
  nn::MultiheadAttention masked, removed;
  Pair(int64_t e, int64_t h, nn::MultiheadAttentionOptions o, const std::vector<int64_t>& gone, uint64_t seed)
      : gen(seed), masked(e, h, seeded(o, &gen)), removed(e, h, o) {
    masked.to(kFloat64);
    removed.to(kFloat64);
    removed.load_state_dict(masked.state_dict());
    std::vector<int64_t> keep;
    for (int64_t k = 0; k < h; ++k)
      if (std::find(gone.begin(), gone.end(), k) == gone.end()) keep.push_back(k);
    compress::mask_heads(masked, keep);
    compress::remove_heads(removed, gone);
  }
};

}  // namespace

TEST(RemoveHeads, ComputesWhatTheMaskedHeadsDo) {
  Pair p(12, 4, {}, {1, 3, 1}, 30);  // a repeated head counts once
  EXPECT_EQ(p.removed.num_heads, 2);
  EXPECT_EQ(p.removed.head_dim, 3);
  EXPECT_EQ(p.removed.embed_dim, 12);
  EXPECT_EQ(p.removed.in_proj_weight.shape(), (Shape{18, 12}));
  EXPECT_EQ(p.removed.in_proj_bias.shape(), (Shape{18}));
  EXPECT_EQ(p.removed.out_proj.weight.shape(), (Shape{12, 6}));
  EXPECT_EQ(p.removed.out_proj.in_features, 6);
  // PyTorch's names, nothing added
  std::vector<std::string> names;
  for (auto& [n, t] : p.removed.state_dict()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"}));
  // the kept rows are the original heads 0 and 2 of q, k and v
  const auto full = values(p.masked.in_proj_weight), cut = values(p.removed.in_proj_weight);
  for (int64_t part = 0; part < 3; ++part)
    for (int64_t r = 0; r < 6; ++r) {
      const int64_t from = part * 12 + (r < 3 ? r : r + 3);
      for (int64_t c = 0; c < 12; ++c) ASSERT_EQ(cut[(part * 6 + r) * 12 + c], full[from * 12 + c]);
    }

  Generator g(31);
  const Tensor x = randn({5, 2, 12}, kFloat64, &g), kv = randn({7, 2, 12}, kFloat64, &g);
  const Tensor pad = from_vector<uint8_t>({0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0}, Shape{2, 7}).to(kBool);
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused attention" : "composed attention");
    nn::functional::FusedAttentionGuard guard(DeviceType::CPU, fused);
    EXPECT_TRUE(all_close(p.removed(x), values(p.masked(x)), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(p.removed.forward(x, kv, kv), values(p.masked.forward(x, kv, kv)), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(p.removed.forward(x, x, x, Tensor(), Tensor(), true),
                          values(p.masked.forward(x, x, x, Tensor(), Tensor(), true)), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(p.removed.forward(x, kv, kv, pad), values(p.masked.forward(x, kv, kv, pad)), 1e-12, 1e-12));
  }
  // the weights of each head left are those of the same head before
  const auto w_removed = p.removed.forward_with_weights(x, x, x, Tensor(), Tensor(), false, false).weights;
  const auto w_masked = p.masked.forward_with_weights(x, x, x, Tensor(), Tensor(), false, false).weights;
  EXPECT_EQ(w_removed.shape(), (Shape{2, 2, 5, 5}));
  const Tensor kept_heads = from_vector<int64_t>({0, 2});
  EXPECT_TRUE(all_close(w_removed, values(index_select(w_masked, 1, kept_heads)), 1e-12, 1e-12));
  // a 3-d attn_mask has one map per head left
  const Tensor causal = triu(ones({5, 5}), 1).to(kBool).expand({4, 5, 5}).contiguous();
  EXPECT_TRUE(all_close(p.removed.forward(x, x, x, Tensor(), causal),
                        values(p.masked.forward(x, x, x, Tensor(), triu(ones({5, 5}), 1).to(kBool))), 1e-12, 1e-12));
  EXPECT_TRUE(throws_with([&] { p.removed.forward(x, x, x, Tensor(), causal.repeat({2, 1, 1})); }, {"attn_mask"}));
}

TEST(RemoveHeads, EveryProjectionLayout) {
  // separate q, k, v weights (kdim, vdim), batch first, bias_k / bias_v and a zero key
  Pair p(8, 4, {.batch_first = true, .kdim = 5, .vdim = 6, .add_bias_kv = true, .add_zero_attn = true}, {0}, 32);
  EXPECT_EQ(p.removed.q_proj_weight.shape(), (Shape{6, 8}));
  EXPECT_EQ(p.removed.k_proj_weight.shape(), (Shape{6, 5}));
  EXPECT_EQ(p.removed.v_proj_weight.shape(), (Shape{6, 6}));
  EXPECT_EQ(p.removed.bias_k.shape(), (Shape{1, 1, 6}));
  const std::vector<double> bias_v = values(p.masked.bias_v);
  EXPECT_EQ(values(p.removed.bias_v), std::vector<double>(bias_v.begin() + 2, bias_v.end()));
  Generator g(33);
  const Tensor q = randn({2, 3, 8}, kFloat64, &g), k = randn({2, 4, 5}, kFloat64, &g);
  const Tensor v = randn({2, 4, 6}, kFloat64, &g);
  EXPECT_TRUE(all_close(p.removed.forward(q, k, v), values(p.masked.forward(q, k, v)), 1e-12, 1e-12));
  // unbatched (L, E) input, and no biases at all
  const Tensor q0 = q.select(0, 0), k0 = k.select(0, 0), v0 = v.select(0, 0);
  EXPECT_TRUE(all_close(p.removed.forward(q0, k0, v0), values(p.masked.forward(q0, k0, v0)), 1e-12, 1e-12));
  Pair nb(8, 2, {.bias = false}, {1}, 34);
  const Tensor x = randn({3, 1, 8}, kFloat64, &g);
  EXPECT_TRUE(all_close(nb.removed(x), values(nb.masked(x)), 1e-12, 1e-12));
}

TEST(RemoveHeads, GradientsMatchFiniteDifferences) {
  Pair p(6, 3, {}, {1}, 35);
  Generator g(36);
  const Tensor x = randn({4, 2, 6}, kFloat64, &g).requires_grad_();
  nn::MultiheadAttention& a = p.removed;
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>&) { return a(x); },
                        {x, a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias}));
  // and an optimizer made after the removal trains the smaller parameters: AdamW's first step
  // without decay moves each entry by lr * g / (|g| + eps)
  optim::AdamW opt(a.parameters(), {.lr = 0.01, .weight_decay = 0});
  a.zero_grad();
  a(x).pow(2).sum().backward();
  const std::vector<double> w = values(a.in_proj_weight), grad = values(a.in_proj_weight.grad());
  opt.step();
  std::vector<double> want(w.size());
  for (size_t i = 0; i < w.size(); ++i) want[i] = w[i] - 0.01 * grad[i] / (std::fabs(grad[i]) + 1e-8);
  EXPECT_TRUE(all_close(a.in_proj_weight, want, 1e-12, 1e-12));
}

TEST(RemoveHeads, AnOptimizerMadeBeforeRaisesAndWritesNothing) {
  Generator g(39);
  nn::MultiheadAttention attn(8, 4, {.generator = &g});
  optim::AdamW opt(attn.parameters(), {.lr = 0.01});
  const Tensor x = randn({3, 2, 8}, kFloat32, &g);
  attn(x).sum().backward();
  opt.step();  // Adam's moments have the old shapes now
  compress::remove_heads(attn, {1});
  attn(x).sum().backward();
  const std::vector<double> before = values(attn.in_proj_weight);
  EXPECT_TRUE(throws_with([&] { opt.step(); }, {"exp_avg", "[24, 8]", "[18, 8]"}));
  EXPECT_EQ(values(attn.in_proj_weight), before);
}

TEST(RemoveHeads, AStateDictLoadsWhereAsManyHeadsWereRemoved) {
  // which heads go does not matter to the shapes: a fresh module with any one head removed takes
  // the state dict of one with head 2 removed, and computes what it does
  Generator g(40);
  nn::MultiheadAttention trained(8, 4, {.generator = &g}), fresh(8, 4);
  trained.to(kFloat64);
  fresh.to(kFloat64);
  compress::remove_heads(trained, {2});
  EXPECT_TRUE(throws_with([&] { fresh.load_state_dict(trained.state_dict()); }, {"in_proj_weight", "[18, 8]"}));
  compress::remove_heads(fresh, {0});
  fresh.load_state_dict(trained.state_dict());
  const Tensor x = randn({3, 2, 8}, kFloat64, &g);
  EXPECT_TRUE(all_close(fresh(x), values(trained(x)), 0, 0));
}

TEST(RemoveHeads, InsideATransformerEncoderLayer) {
  Generator g(37);
  nn::TransformerEncoderLayer masked(8, 4, {.dim_feedforward = 16, .generator = &g});
  nn::TransformerEncoderLayer removed(8, 4, {.dim_feedforward = 16});
  masked.to(kFloat64).eval();
  removed.to(kFloat64).eval();
  removed.load_state_dict(masked.state_dict());
  compress::mask_heads(masked.self_attn, {0, 3});
  compress::remove_heads(removed.self_attn, {1, 2});
  const Tensor x = randn({5, 2, 8}, kFloat64, &g);
  EXPECT_TRUE(all_close(removed(x), values(masked(x)), 1e-12, 1e-12));
  removed.train();  // training (with dropout) runs and reaches the smaller projections
  removed(x).sum().backward();
  EXPECT_EQ(removed.self_attn.in_proj_weight.grad().shape(), (Shape{12, 8}));
}

TEST(RemoveHeads, CutsPruningMasksAlong) {
  Generator g(38);
  nn::MultiheadAttention attn(8, 4, {.generator = &g});
  attn.to(kFloat64);
  const std::vector<int64_t> kept = compress::prune_heads(attn, 2);  // masks on the projections
  compress::l1_unstructured(attn.out_proj, "weight", 0.25);
  const Tensor x = randn({3, 2, 8}, kFloat64, &g);
  const std::vector<double> before = values(attn(x));
  std::vector<int64_t> gone;
  for (int64_t h = 0; h < 4; ++h)
    if (std::find(kept.begin(), kept.end(), h) == kept.end()) gone.push_back(h);
  compress::remove_heads(attn, gone);
  EXPECT_EQ(attn.state_dict().at("in_proj_weight_mask").shape(), (Shape{12, 8}));
  EXPECT_EQ(attn.state_dict().at("out_proj.weight_mask").shape(), (Shape{8, 4}));
  EXPECT_TRUE(all_close(attn(x), before, 1e-12, 1e-12));
  attn(x).sum().backward();  // the gradient hooks mask with the cut masks
  const auto grad = values(attn.out_proj.weight.grad()), mask = values(attn.state_dict().at("out_proj.weight_mask"));
  for (size_t i = 0; i < grad.size(); ++i)
    if (mask[i] == 0) EXPECT_EQ(grad[i], 0.0);
  compress::remove(attn, "in_proj_weight");
  EXPECT_EQ(compress::head_importance(attn).numel(), 2);
}

TEST(RemoveHeads, BadInputRaises) {
  nn::MultiheadAttention attn(8, 4);
  EXPECT_TRUE(throws_with([&] { compress::remove_heads(attn, {0, 1, 2, 3}); }, {"remove_heads", "all 4 heads"}));
  EXPECT_TRUE(throws_with([&] { compress::remove_heads(attn, {4}); }, {"head 4 is out of range for 4 heads"}));
  EXPECT_TRUE(throws_with([&] { compress::remove_heads(attn, {-1}); }, {"head -1 is out of range"}));
  EXPECT_EQ(attn.in_proj_weight.shape(), (Shape{24, 8}));  // nothing was cut
  compress::remove_heads(attn, {});                          // nothing to remove
  compress::remove_heads(attn, {0, 2});
  EXPECT_TRUE(throws_with([&] { compress::remove_heads(attn, {2}); }, {"head 2 is out of range for 2 heads"}));
  EXPECT_TRUE(throws_with([&] { compress::remove_heads(attn, {0, 1}); }, {"all 2 heads"}));
  // heads changed behind the module's back: the forward names the mismatch
  attn.num_heads = 3;
  EXPECT_TRUE(throws_with([&] { attn(randn({2, 1, 8})); }, {"out_proj.weight", "num_heads * head_dim"}));
}
