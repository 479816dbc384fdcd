// Traced dependency groups through MultiheadAttention: its heads are units (cut by
// remove_heads), its embed_dim goes with the residual stream, separate q/k/v weights' query,
// key and value features go with their producers; a TransformerEncoderLayer. Pruned models
// compute what their twins compute with a removed head's out_proj columns or a removed feature
// zeroed (float64, 1e-12); a failed prune leaves the attention as it was; a call returning the
// attention weights is reported unprunable.
#include <tuple>

#include "depgraph_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::channels_of;
using strata::testing::expect_same;
using strata::testing::expect_trains;
using strata::testing::expect_unprunable;
using strata::testing::group_of;
using strata::testing::throws_with;
using strata::testing::twins;
using strata::testing::values;
using strata::testing::zero_rows;
using strata::testing::zero_slices;
using R = compress::ChannelRole;

namespace {

// tokens -> Embedding -> self-attention (4 heads of 2) + residual -> mean over the tokens -> fc
struct AttentionNet : nn::Module {
  nn::Embedding emb;
  nn::MultiheadAttention attn;
  nn::Linear fc;
  bool fixed_heads = false;  // the forward insists on 4 heads
  explicit AttentionNet(Generator& g)
      : emb(10, 8, {.generator = &g}), attn(8, 4, {.batch_first = true, .generator = &g}), fc(8, 3, {.generator = &g}) {
    register_module("emb", emb), register_module("attn", attn), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    STRATA_CHECK(!fixed_heads || attn.num_heads == 4, "[AttentionNet] expects 4 heads");
    const Tensor e = emb(x);
    return fc((attn(e, e, e) + e).mean(1));
  }
};

TEST(DependencyGraphAttention, AttentionHeadsAndTheResidualStreamMatchTheZeroedNetwork) {
  const Tensor tokens = from_vector(std::vector<int64_t>{1, 4, 9, 0, 3, 3, 7, 2, 5}).view({3, 3});
  auto [pruned, zeroed] = twins<AttentionNet>(tokens);
  compress::DependencyGraph graph(*pruned, tokens);
  const size_t heads = group_of(graph, &pruned->attn, R::Head);
  EXPECT_TRUE(graph.groups()[heads].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[heads].size, 4);
  EXPECT_EQ(graph.groups()[heads].members.size(), 1u);
  const auto want = values(compress::head_importance(pruned->attn, compress::Importance::L2));
  const auto got = graph.importance(heads, compress::Importance::L2);
  for (size_t h = 0; h < 4; ++h) EXPECT_NEAR(got[h], want[h], 1e-12);
  // the residual stream: the embedding's features, attention's embed_dim in and out, fc's inputs
  const size_t stream = group_of(graph, &pruned->emb, R::Out);
  EXPECT_TRUE(graph.groups()[stream].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[stream].size, 8);
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{
           {&pruned->attn, R::In}, {&pruned->attn, R::Out}, {&pruned->fc, R::In}})
    EXPECT_EQ(group_of(graph, m, role), stream) << graph.report();

  // a ratio keyed by the attention layer is its heads' (the stream keeps every feature)
  const auto selected = graph.select(0.0, {.ratios = {{&pruned->attn, 0.5}}});
  EXPECT_EQ(selected[heads].size(), 2u);
  EXPECT_EQ(selected[stream].size(), 8u);

  graph.prune_group(heads, {0, 3});
  const size_t stream_now = group_of(graph, &pruned->emb, R::Out);
  graph.prune_group(stream_now, {0, 1, 4, 6, 7});
  AttentionNet& z = *zeroed;  // a removed head adds nothing: zero its out_proj columns
  zero_slices({z.attn.out_proj.weight}, 1, channels_of({1, 2}, 2));
  zero_slices({z.emb.weight}, 1, {2, 3, 5});  // a removed feature is zero in and out of attention
  zero_rows({z.attn.out_proj.weight, z.attn.out_proj.bias}, {2, 3, 5});
  EXPECT_EQ(pruned->attn.num_heads, 2);
  EXPECT_EQ(pruned->attn.embed_dim, 5);
  EXPECT_EQ(pruned->attn.in_proj_weight.shape(), (Shape{3 * 4, 5}));
  EXPECT_EQ(pruned->attn.out_proj.weight.shape(), (Shape{5, 4}));
  EXPECT_EQ(pruned->fc.in_features, 5);
  EXPECT_EQ(graph.groups()[group_of(graph, &pruned->attn, R::Head)].size, 2);
  expect_same(*pruned, *zeroed, tokens);
  expect_trains(*pruned, tokens, 3);
}

// Cross-attention with a key and a value of their own widths (kdim = 6, vdim = 7): separate
// q/k/v weights, whose query, key and value features are pruned with their producers.
struct CrossAttentionNet : nn::Module {
  nn::Linear q, k, v;
  nn::MultiheadAttention attn;
  nn::Linear fc;
  explicit CrossAttentionNet(Generator& g)
      : q(5, 8, {.generator = &g}), k(5, 6, {.generator = &g}), v(5, 7, {.generator = &g}),
        attn(8, 2, {.batch_first = true, .generator = &g, .kdim = 6, .vdim = 7}), fc(8, 3, {.generator = &g}) {
    register_module("q", q), register_module("k", k), register_module("v", v), register_module("attn", attn);
    register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override { return fc(attn(q(x), k(x), v(x)).mean(1)); }
};

TEST(DependencyGraphAttention, SeparateQueryKeyAndValueFeaturesMatchTheZeroedNetwork) {
  Generator g(37);
  const Tensor x = randn({2, 3, 5}, kFloat64, &g);
  auto [pruned, zeroed] = twins<CrossAttentionNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  for (auto [producer, role, size] : std::vector<std::tuple<nn::Linear*, R, int64_t>>{
           {&pruned->q, R::In, 8}, {&pruned->k, R::Key, 6}, {&pruned->v, R::Value, 7}}) {
    const size_t group = group_of(graph, producer, R::Out);
    EXPECT_TRUE(graph.groups()[group].prunable()) << graph.report();
    EXPECT_EQ(graph.groups()[group].size, size);
    EXPECT_EQ(group_of(graph, &pruned->attn, role), group) << graph.report();
  }
  const size_t keys = group_of(graph, &pruned->k, R::Out);
  const auto scores = graph.importance(keys);
  for (int64_t c = 0; c < 6; ++c) {
    const Tensor rows = abs(pruned->k.weight.select(0, c)).sum();
    const Tensor columns = abs(pruned->attn.k_proj_weight.select(1, c)).sum();
    EXPECT_NEAR(scores[c], (rows + columns).item<double>(), 1e-9);
  }
  graph.prune_group(keys, {0, 2, 3, 5});
  graph.prune_group(group_of(graph, &pruned->v, R::Out), {1, 2, 3, 6});
  graph.prune_group(group_of(graph, &pruned->q, R::Out), {0, 1, 2, 4, 5, 7});
  CrossAttentionNet& z = *zeroed;
  zero_rows({z.k.weight, z.k.bias}, {1, 4});
  zero_rows({z.v.weight, z.v.bias}, {0, 4, 5});
  zero_rows({z.q.weight, z.q.bias}, {3, 6});
  EXPECT_EQ(pruned->attn.kdim, 4);
  EXPECT_EQ(pruned->attn.vdim, 4);
  EXPECT_EQ(pruned->attn.embed_dim, 6);
  EXPECT_EQ(pruned->attn.q_proj_weight.shape(), (Shape{8, 6}));
  EXPECT_EQ(pruned->attn.k_proj_weight.shape(), (Shape{8, 4}));
  EXPECT_EQ(pruned->attn.v_proj_weight.shape(), (Shape{8, 4}));
  expect_same(*pruned, *zeroed, x);
  graph.prune_group(group_of(graph, &pruned->attn, R::Head), {1});
  EXPECT_EQ(pruned->attn.num_heads, 1);
  expect_trains(*pruned, x, 3);
}

TEST(DependencyGraphAttention, AFailedPruneLeavesTheAttentionAsItWas) {
  const Tensor tokens = from_vector(std::vector<int64_t>{1, 4, 9, 0, 3, 3}).view({2, 3});
  auto [net, reference] = twins<AttentionNet>(tokens);
  compress::DependencyGraph graph(*net, tokens);
  net->fixed_heads = true;
  EXPECT_TRUE(throws_with([&] { graph.prune_group(group_of(graph, &net->attn, R::Head), {2}); },
                          {"nothing was pruned"}));
  EXPECT_EQ(net->attn.num_heads, 4);
  EXPECT_TRUE(all_close(net->attn.out_proj.weight, values(reference->attn.out_proj.weight), 0, 0));
  expect_same(*net, *reference, tokens);
}

// tokens -> Embedding -> TransformerEncoderLayer (2 heads, LayerNorms on the stream) -> mean -> fc
struct EncoderNet : nn::Module {
  nn::Embedding emb;
  nn::TransformerEncoderLayer layer;
  nn::Linear fc;
  explicit EncoderNet(Generator& g)
      : emb(10, 8, {.generator = &g}),
        layer(8, 2, {.dim_feedforward = 6, .dropout = 0, .batch_first = true, .generator = &g}),
        fc(8, 3, {.generator = &g}) {
    register_module("emb", emb), register_module("layer", layer), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override { return fc(layer(emb(x)).mean(1)); }
};

TEST(DependencyGraphAttention, TransformerEncoderLayerHeadsAndFeedForwardMatchTheZeroedNetwork) {
  const Tensor tokens = from_vector(std::vector<int64_t>{1, 4, 9, 0, 3, 3, 7, 2}).view({2, 4});
  auto [pruned, zeroed] = twins<EncoderNet>(tokens);
  compress::DependencyGraph graph(*pruned, tokens);
  nn::TransformerEncoderLayer& l = pruned->layer;
  const size_t stream = group_of(graph, &pruned->emb, R::Out);
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{{&l.self_attn, R::In}, {&l.self_attn, R::Out},
                                                                {&l.norm1, R::Norm}, {&l.linear1, R::In},
                                                                {&l.linear2, R::Out}, {&l.norm2, R::Norm},
                                                                {&pruned->fc, R::In}})
    EXPECT_EQ(group_of(graph, m, role), stream) << graph.report();
  EXPECT_TRUE(graph.groups()[stream].prunable()) << graph.report();
  const size_t hidden = group_of(graph, &l.linear1, R::Out);
  EXPECT_EQ(group_of(graph, &l.linear2, R::In), hidden);
  EXPECT_EQ(graph.groups()[hidden].size, 6);
  // heads and the feed-forward's hidden features leave the stream's LayerNorms as they were
  graph.prune_group(group_of(graph, &l.self_attn, R::Head), {1});
  graph.prune_group(group_of(graph, &l.linear1, R::Out), {0, 2, 3, 5});
  nn::TransformerEncoderLayer& z = zeroed->layer;
  zero_slices({z.self_attn.out_proj.weight}, 1, channels_of({0}, 4));
  zero_rows({z.linear1.weight, z.linear1.bias}, {1, 4});
  EXPECT_EQ(l.self_attn.num_heads, 1);
  EXPECT_EQ(l.linear1.out_features, 4);
  EXPECT_EQ(l.linear2.weight.shape(), (Shape{8, 4}));
  expect_same(*pruned, *zeroed, tokens);
  // the stream too (its LayerNorms then normalize over the features that stay)
  graph.prune(0.25);
  EXPECT_EQ(pruned->emb.embedding_dim, 6);
  EXPECT_EQ(l.self_attn.embed_dim, 6);
  EXPECT_EQ(l.norm2.normalized_shape, (Shape{6}));
  expect_trains(*pruned, tokens, 3);
}

// call_with_weights returns the attention weights too: the call is not followed whole, and the
// reason says so (not a recurrent layer's states)
TEST(DependencyGraphAttention, ACallReturningTheWeightsIsReportedUnprunable) {
  struct Net : nn::Module {
    nn::Linear in;
    nn::MultiheadAttention attn;
    nn::Linear fc;
    explicit Net(Generator& g)
        : in(5, 8, {.generator = &g}), attn(8, 2, {.batch_first = true, .generator = &g}), fc(8, 3, {.generator = &g}) {
      register_module("in", in), register_module("attn", attn), register_module("fc", fc);
    }
    Tensor forward(const Tensor& x) override {
      const Tensor h = in(x);
      return fc(attn.call_with_weights(h, h, h).output.mean(1));
    }
  };
  Generator g(107);
  Net net(g);
  compress::DependencyGraph graph(net, randn({2, 3, 5}, kFloat32, &g));
  expect_unprunable(graph, &net.in, R::Out, "a call of MultiheadAttention returning several results");
  EXPECT_EQ(graph.groups()[group_of(graph, &net.in, R::Out)].unprunable_reason.find("recurrent"), std::string::npos)
      << graph.report();
}

}  // namespace
