// Traced dependency groups through ops that move, split and merge the channels: attention written
// with separate q / k / v Linears (heads split by a view, q kᵀ, softmax, · v, heads merged), the
// same with one qkv Linear chunked in three, a gated unit (chunk in two, a * sigmoid(b)), and
// permute. Pruned models compute what their twins compute with the removed channels' weights
// zeroed by hand (float64, 1e-12); a split into parts of unequal sizes and heads multiplied by
// a per-head parameter are reported unprunable.
#include "depgraph_testing.h"

using namespace strata;
using strata::testing::channels_of;
using strata::testing::expect_same;
using strata::testing::expect_trains;
using strata::testing::expect_unprunable;
using strata::testing::group_of;
using strata::testing::twins;
using strata::testing::zero_rows;
using strata::testing::zero_slices;
namespace F = strata::nn::functional;
using R = compress::ChannelRole;

namespace {

// q, k, v (N, T, E) -> softmax(q kᵀ / 2) v per head of head_dim (by hand, or by
// scaled_dot_product_attention), heads merged back: (N, T, E)
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, int64_t head_dim, bool sdpa = false) {
  auto heads = [&](const Tensor& t) { return t.view({t.size(0), t.size(1), -1, head_dim}).transpose(1, 2); };
  const Tensor o = (sdpa ? F::scaled_dot_product_attention(heads(q), heads(k), heads(v), {}, 0, false, 0.5)
                         : matmul(F::softmax(matmul(heads(q), heads(k).transpose(-2, -1)) / 2.0, -1), heads(v)))
                       .transpose(1, 2);  // (N, T, heads, head_dim)
  return o.reshape({o.size(0), o.size(1), -1});
}

// x (N, T, 5) -> emb -> self-attention (2 heads of 4, separate q, k, v) + residual -> mean -> fc
struct HeadsNet : nn::Module {
  nn::Linear emb, q, k, v, out, fc;
  bool sdpa = false;  // scaled_dot_product_attention rather than matmul and softmax
  explicit HeadsNet(Generator& g)
      : emb(5, 8, {.generator = &g}), q(8, 8, {.generator = &g}), k(8, 8, {.generator = &g}),
        v(8, 8, {.generator = &g}), out(8, 8, {.generator = &g}), fc(8, 3, {.generator = &g}) {
    register_module("emb", emb), register_module("q", q), register_module("k", k), register_module("v", v);
    register_module("out", out), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor e = emb(x);
    return fc((out(attend(q(e), k(e), v(e), 4, sdpa)) + e).mean(1));
  }
};

TEST(DependencyGraphViews, SeparateQkvHeadsAndTheStreamMatchTheZeroedNetwork) {
  Generator g(41);
  const Tensor x = randn({2, 3, 5}, kFloat64, &g);
  auto [pruned, zeroed] = twins<HeadsNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t heads = group_of(graph, &pruned->q, R::Out);
  EXPECT_TRUE(graph.groups()[heads].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[heads].size, 2);  // a unit is a whole head: q, k, v rows and out's columns
  for (nn::Module* m : {&pruned->k, &pruned->v}) EXPECT_EQ(group_of(graph, m, R::Out), heads) << graph.report();
  EXPECT_EQ(group_of(graph, &pruned->out, R::In), heads);
  const size_t stream = group_of(graph, &pruned->emb, R::Out);
  EXPECT_TRUE(graph.groups()[stream].prunable()) << graph.report();
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{
           {&pruned->q, R::In}, {&pruned->v, R::In}, {&pruned->out, R::Out}, {&pruned->fc, R::In}})
    EXPECT_EQ(group_of(graph, m, role), stream) << graph.report();
  // head 1's importance: its rows of q, k, v and its columns of out, L1
  double want = 0;
  for (nn::Linear* l : {&pruned->q, &pruned->k, &pruned->v})
    want += abs(l->weight.narrow(0, 4, 4)).sum().item<double>();
  want += abs(pruned->out.weight.narrow(1, 4, 4)).sum().item<double>();
  EXPECT_NEAR(graph.importance(heads)[1], want, 1e-9);

  graph.prune_group(heads, {1});
  graph.prune_group(group_of(graph, &pruned->emb, R::Out), {0, 2, 3, 4, 6});
  HeadsNet& z = *zeroed;
  zero_slices({z.out.weight}, 1, channels_of({0}, 4));  // head 0 adds nothing
  zero_rows({z.emb.weight, z.emb.bias, z.out.weight, z.out.bias}, {1, 5, 7});
  EXPECT_EQ(pruned->q.weight.shape(), (Shape{4, 5}));
  EXPECT_EQ(pruned->v.out_features, 4);
  EXPECT_EQ(pruned->out.weight.shape(), (Shape{5, 4}));
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

// The fused attention op (on by default on the CPU) and its composed fallback
TEST(DependencyGraphViews, ScaledDotProductAttentionHeadsMatchTheZeroedNetwork) {
  for (bool fused : {true, false}) {
    F::FusedAttentionGuard guard(DeviceType::CPU, fused);
    Generator g(42);
    const Tensor x = randn({2, 3, 5}, kFloat64, &g);
    auto [pruned, zeroed] = twins<HeadsNet>(x);
    pruned->sdpa = zeroed->sdpa = true;
    compress::DependencyGraph graph(*pruned, x);
    const size_t heads = group_of(graph, &pruned->q, R::Out);
    EXPECT_TRUE(graph.groups()[heads].prunable()) << graph.report();
    EXPECT_EQ(graph.groups()[heads].size, 2);
    EXPECT_EQ(group_of(graph, &pruned->v, R::Out), heads);
    graph.prune_group(heads, {0});
    zero_slices({zeroed->out.weight}, 1, channels_of({1}, 4));
    EXPECT_EQ(pruned->k.out_features, 4);
    expect_same(*pruned, *zeroed, x);
  }
}

// As HeadsNet with one qkv Linear (24 outputs) chunked into q, k, v
struct FusedQkvNet : nn::Module {
  nn::Linear qkv, out, fc;
  explicit FusedQkvNet(Generator& g)
      : qkv(5, 24, {.generator = &g}), out(8, 6, {.generator = &g}), fc(6, 3, {.generator = &g}) {
    register_module("qkv", qkv), register_module("out", out), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    const std::vector<Tensor> p = chunk(qkv(x), 3, -1);
    return fc(out(attend(p[0], p[1], p[2], 2)).mean(1));
  }
};

TEST(DependencyGraphViews, ChunkedQkvHeadsMatchTheZeroedNetwork) {
  Generator g(43);
  const Tensor x = randn({2, 3, 5}, kFloat64, &g);
  auto [pruned, zeroed] = twins<FusedQkvNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t heads = group_of(graph, &pruned->qkv, R::Out);
  EXPECT_TRUE(graph.groups()[heads].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[heads].size, 4);  // 4 heads of 2, each with its rows of q, k and v
  EXPECT_EQ(group_of(graph, &pruned->out, R::In), heads);
  graph.prune_group(heads, {0, 3});
  zero_slices({zeroed->out.weight}, 1, channels_of({1, 2}, 2));
  EXPECT_EQ(pruned->qkv.out_features, 12);
  EXPECT_EQ(pruned->out.in_features, 4);
  expect_same(*pruned, *zeroed, x);
}

// x (N, 4, L) -> conv (12 channels) -> chunk in two along the channels -> a * sigmoid(b) ->
// permute to (N, L, 6) -> fc1 -> mean over L -> fc2; `unequal` splits 5 + 7 instead
struct GatedNet : nn::Module {
  nn::Conv1d conv;
  nn::Linear fc1, fc2;
  bool unequal = false;
  explicit GatedNet(Generator& g)
      : conv(4, 12, 1, {.generator = &g}), fc1(6, 5, {.generator = &g}), fc2(5, 3, {.generator = &g}) {
    register_module("conv", conv), register_module("fc1", fc1), register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override {
    if (unequal) {
      const std::vector<Tensor> p = split_with_sizes(conv(x), {5, 7}, 1);
      return fc2(fc1(cat({p[0], p[1].narrow(1, 0, 1)}, 1).permute({0, 2, 1})).mean(1));
    }
    const std::vector<Tensor> p = chunk(conv(x), 2, 1);
    return fc2(F::relu(fc1((p[0] * sigmoid(p[1])).permute({0, 2, 1}))).mean(1));
  }
};

TEST(DependencyGraphViews, ChunkedGateAndPermuteMatchTheZeroedNetwork) {
  Generator g(47);
  const Tensor x = randn({2, 4, 6}, kFloat64, &g);  // L = 6 as the gate's channels: only the dims tell them apart
  auto [pruned, zeroed] = twins<GatedNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t gate = group_of(graph, &pruned->conv, R::Out);
  EXPECT_TRUE(graph.groups()[gate].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[gate].size, 6);  // channel c and c + 6 of the conv are one unit
  EXPECT_EQ(group_of(graph, &pruned->fc1, R::In), gate);
  graph.prune_group(gate, {0, 2, 5});
  zero_rows({zeroed->conv.weight, zeroed->conv.bias}, {1, 3, 4});  // a is 0 where b is not
  EXPECT_EQ(pruned->conv.out_channels, 6);
  EXPECT_EQ(pruned->fc1.in_features, 3);
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

// x (N, 5) -> a -> unsqueeze(0) -> relu -> squeeze(0) -> b: the channels move with the size-1 dim
struct SqueezedNet : nn::Module {
  nn::Linear a, b;
  explicit SqueezedNet(Generator& g) : a(5, 6, {.generator = &g}), b(6, 3, {.generator = &g}) {
    register_module("a", a), register_module("b", b);
  }
  Tensor forward(const Tensor& x) override { return b(F::relu(a(x).unsqueeze(0)).squeeze(0)); }
};

TEST(DependencyGraphViews, ChannelsMoveWithSizeOneDimsMatchTheZeroedNetwork) {
  Generator g(89);
  const Tensor x = randn({2, 5}, kFloat64, &g);
  auto [pruned, zeroed] = twins<SqueezedNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t group = group_of(graph, &pruned->a, R::Out);
  EXPECT_TRUE(graph.groups()[group].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[group].size, 6);
  EXPECT_EQ(group_of(graph, &pruned->b, R::In), group);
  graph.prune_group(group, {0, 2, 3});
  zero_rows({zeroed->a.weight, zeroed->a.bias}, {1, 4, 5});
  EXPECT_EQ(pruned->b.in_features, 3);
  expect_same(*pruned, *zeroed, x);
}

TEST(DependencyGraphViews, ASplitIntoUnequalPartsIsReportedUnprunable) {
  Generator g(53);
  GatedNet net(g);
  net.unequal = true;
  compress::DependencyGraph graph(net, randn({2, 4, 3}, kFloat32, &g));
  expect_unprunable(graph, &net.conv, R::Out, "parts of unequal sizes");
  EXPECT_TRUE(graph.groups()[group_of(graph, &net.fc1, R::Out)].prunable()) << graph.report();
}

TEST(DependencyGraphViews, SoftmaxOverTheHeadsIsReportedUnprunable) {
  struct Net : nn::Module {
    nn::Linear q, fc;
    explicit Net(Generator& g) : q(5, 8, {.generator = &g}), fc(8, 3, {.generator = &g}) {
      register_module("q", q), register_module("fc", fc);
    }
    Tensor forward(const Tensor& x) override {
      const Tensor h = q(x).view({x.size(0), x.size(1), 2, 4});
      return fc(F::softmax(h, 2).reshape({x.size(0), x.size(1), 8}).mean(1));
    }
  };
  Generator g(59);
  Net net(g);
  compress::DependencyGraph graph(net, randn({2, 3, 5}, kFloat32, &g));
  expect_unprunable(graph, &net.q, R::Out, "over the channel dim");
}

// Every dim of size 2 (N = T = heads = head_dim = 2, 4 features): only the recorded dims tell them apart
struct SquareHeadsNet : nn::Module {
  nn::Linear emb, q, k, v, out, fc;
  explicit SquareHeadsNet(Generator& g)
      : emb(2, 4, {.generator = &g}), q(4, 4, {.generator = &g}), k(4, 4, {.generator = &g}),
        v(4, 4, {.generator = &g}), out(4, 4, {.generator = &g}), fc(4, 2, {.generator = &g}) {
    register_module("emb", emb), register_module("q", q), register_module("k", k), register_module("v", v);
    register_module("out", out), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor e = emb(x);
    return fc((out(attend(q(e), k(e), v(e), 2)) + e).mean(1));
  }
};

TEST(DependencyGraphViews, HeadsAsManyAsTheirWidthMatchTheZeroedNetwork) {
  Generator g(101);
  const Tensor x = randn({2, 2, 2}, kFloat64, &g);
  auto [pruned, zeroed] = twins<SquareHeadsNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t heads = group_of(graph, &pruned->q, R::Out);
  EXPECT_TRUE(graph.groups()[heads].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[heads].size, 2);
  EXPECT_EQ(group_of(graph, &pruned->out, R::In), heads);
  graph.prune_group(heads, {1});
  zero_slices({zeroed->out.weight}, 1, channels_of({0}, 2));
  expect_same(*pruned, *zeroed, x);
}

// Heads (N, 2, T, 4) times a per-head parameter of the net's own (2, 4, 4): the parameter's head
// dim would have to shrink with the heads, which no layer rule does, so the heads are kept
struct PerHeadMixNet : nn::Module {
  nn::Linear q, fc;
  Tensor mix;
  bool mix_first = false;  // mix @ heads (the heads on b) rather than heads @ mix
  explicit PerHeadMixNet(Generator& g) : q(5, 8, {.generator = &g}), fc(8, 3, {.generator = &g}) {
    register_module("q", q), register_module("fc", fc);
    mix = register_parameter("mix", randn({2, 4, 4}, kFloat32, &g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = q(x).view({x.size(0), x.size(1), -1, 4}).transpose(1, 2);  // (N, heads, T, 4)
    h = mix_first ? matmul(mix, h.transpose(-2, -1)).transpose(-2, -1) : matmul(h, mix);
    return fc(h.transpose(1, 2).reshape({x.size(0), x.size(1), -1}).mean(1));
  }
};

TEST(DependencyGraphViews, HeadsMultipliedByAParameterPerHeadAreReportedUnprunable) {
  for (bool mix_first : {false, true}) {
    Generator g(97);
    PerHeadMixNet net(g);
    net.mix_first = mix_first;
    compress::DependencyGraph graph(net, randn({2, 3, 5}, kFloat32, &g));
    expect_unprunable(graph, &net.q, R::Out, "a matmul");
  }
}

}  // namespace
