// Traced dependency groups through Conv1d (with BatchNorm1d and a flatten into a Linear), Conv3d
// with GroupNorm, ConvTranspose1d/2d/3d (grouped and not) with InstanceNorm2d, and Embedding.
// After pruning, each model computes what its twin computes with the same channels zeroed by
// hand (a GroupNorm's whole groups) in float64 to 1e-12; sizes and groups are updated; the
// pruned models train; what is not followed is reported with the reason; a failed prune leaves
// the model as it was. A transpose moves the channels.
#include <cmath>

#include "depgraph_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::channels_of;
using strata::testing::complement;
using strata::testing::expect_same;
using strata::testing::expect_trains;
using strata::testing::expect_unprunable;
using strata::testing::group_of;
using strata::testing::randomize;
using strata::testing::throws_with;
using strata::testing::twins;
using strata::testing::values;
using strata::testing::zero_rows;
using strata::testing::zero_slices;
namespace F = strata::nn::functional;
using R = compress::ChannelRole;

namespace {

// (N, 3, 8) -> c1 -> BatchNorm1d -> c2 (3 groups) -> flatten -> fc1 -> BatchNorm1d (2-d) -> fc2
struct Conv1dNet : nn::Module {
  nn::Conv1d c1, c2;
  nn::BatchNorm1d bn{6}, bnf{7};
  nn::Linear fc1, fc2;
  explicit Conv1dNet(Generator& g)
      : c1(3, 6, 3, {.padding = 1, .generator = &g}), c2(6, 6, 3, {.padding = 1, .groups = 3, .generator = &g}),
        fc1(6 * 8, 7, {.generator = &g}), fc2(7, 3, {.generator = &g}) {
    register_module("c1", c1), register_module("bn", bn), register_module("c2", c2);
    register_module("fc1", fc1), register_module("bnf", bnf), register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::relu(c2(F::relu(bn(c1(x)))));
    return fc2(F::relu(bnf(fc1(h.flatten(1)))));
  }
};

TEST(DependencyGraphLayers, Conv1dGroupedAndFlattenedMatchTheZeroedNetwork) {
  Generator g(31);
  const Tensor x = randn({4, 3, 8}, kFloat64, &g);
  auto [pruned, zeroed] = twins<Conv1dNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  // c1's channels go by c2's groups of 2: 3 units, each 2 channels and 2 blocks of 8 features of fc1
  const size_t conv = group_of(graph, &pruned->c1, R::Out);
  EXPECT_TRUE(graph.groups()[conv].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[conv].size, 3);
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{
           {&pruned->bn, R::Norm}, {&pruned->c2, R::In}, {&pruned->c2, R::Out}, {&pruned->fc1, R::In}})
    EXPECT_EQ(group_of(graph, m, role), conv) << graph.report();
  const size_t hidden = group_of(graph, &pruned->fc1, R::Out);
  EXPECT_EQ(group_of(graph, &pruned->bnf, R::Norm), hidden);
  EXPECT_EQ(graph.groups()[hidden].size, 7);

  ASSERT_NO_THROW(graph.prune_group(conv, {0, 2}));
  const size_t h = group_of(graph, &pruned->fc1, R::Out);
  const std::vector<int64_t> kept_hidden{0, 2, 5, 6};
  graph.prune_group(h, kept_hidden);
  Conv1dNet& z = *zeroed;
  const auto gone = channels_of({1}, 2);
  zero_rows({z.c1.weight, z.c1.bias, z.bn.weight, z.bn.bias, z.c2.weight, z.c2.bias}, gone);
  zero_rows({z.fc1.weight, z.fc1.bias, z.bnf.weight, z.bnf.bias}, complement(7, kept_hidden));
  EXPECT_EQ(pruned->c1.weight.shape(), (Shape{4, 3, 3}));
  EXPECT_EQ(pruned->c2.weight.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(pruned->c2.options.groups, 2);
  EXPECT_EQ(pruned->bn.num_features, 4);
  EXPECT_EQ(pruned->fc1.weight.shape(), (Shape{4, 4 * 8}));
  EXPECT_EQ(pruned->bnf.running_var.shape(), (Shape{4}));
  EXPECT_EQ(pruned->fc2.in_features, 4);
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

// (N, 2, 5, 6, 7) -> c1 -> GroupNorm (3 groups of 2) -> max pool -> c2 -> average pool -> fc
struct Conv3dNet : nn::Module {
  nn::Conv3d c1, c2;
  nn::GroupNorm gn{3, 6};
  nn::Linear fc;
  bool fixed_width = false;  // the forward insists on c1's 6 channels
  explicit Conv3dNet(Generator& g)
      : c1(2, 6, 3, {.padding = 1, .generator = &g}), c2(6, 4, 1, {.generator = &g}), fc(4, 3, {.generator = &g}) {
    register_module("c1", c1), register_module("gn", gn), register_module("c2", c2), register_module("fc", fc);
    randomize(g, {gn.weight, gn.bias});
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::max_pool3d(F::relu(gn(c1(x))), 2);
    STRATA_CHECK(!fixed_width || h.size(1) == 6, "[Conv3dNet] expects 6 channels");
    return fc(F::adaptive_avg_pool3d(F::relu(c2(h)), {1, 1, 1}).flatten(1));
  }
};

TEST(DependencyGraphLayers, Conv3dWithGroupNormRemovesWholeGroups) {
  Generator g(32);
  const Tensor x = randn({2, 2, 5, 6, 7}, kFloat64, &g);
  auto [pruned, zeroed] = twins<Conv3dNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t grouped = group_of(graph, &pruned->c1, R::Out);
  EXPECT_EQ(group_of(graph, &pruned->gn, R::Norm), grouped);
  EXPECT_EQ(group_of(graph, &pruned->c2, R::In), grouped);
  EXPECT_EQ(graph.groups()[grouped].size, 3) << graph.report();  // a unit is a norm group
  // importance: L1 of the unit's c1 filters, gn weights and c2 columns, summed here
  const auto w1 = values(pruned->c1.weight), gamma = values(pruned->gn.weight), w2 = values(pruned->c2.weight);
  const auto got = graph.importance(grouped);
  for (int64_t u = 0; u < 3; ++u) {
    double want = 0;
    for (int64_t c = 2 * u; c < 2 * u + 2; ++c) {
      want += std::fabs(gamma[c]);
      for (int64_t i = 0; i < 2 * 27; ++i) want += std::fabs(w1[c * 54 + i]);
      for (int64_t o = 0; o < 4; ++o) want += std::fabs(w2[o * 6 + c]);
    }
    EXPECT_NEAR(got[u], want, 1e-9);
  }
  graph.prune_group(grouped, {0, 2});
  const size_t out = group_of(graph, &pruned->c2, R::Out);
  graph.prune_group(out, {1, 2, 3});
  Conv3dNet& z = *zeroed;
  zero_rows({z.c1.weight, z.c1.bias, z.gn.weight, z.gn.bias}, channels_of({1}, 2));
  zero_rows({z.c2.weight, z.c2.bias}, {0});
  EXPECT_EQ(pruned->gn.num_groups, 2);
  EXPECT_EQ(pruned->gn.num_channels, 4);
  EXPECT_EQ(pruned->c1.weight.shape(), (Shape{4, 2, 3, 3, 3}));
  EXPECT_EQ(pruned->c2.weight.shape(), (Shape{3, 4, 1, 1, 1}));
  EXPECT_EQ(pruned->fc.in_features, 3);
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

// c1 -> InstanceNorm2d (affine) -> t1 (transposed, 2 groups, upsampling) -> t2 (transposed) -> pool -> fc
struct TransposedNet : nn::Module {
  nn::Conv2d c1;
  nn::InstanceNorm2d in{6, {.affine = true, .track_running_stats = true}};
  nn::ConvTranspose2d t1, t2;
  nn::Linear fc;
  explicit TransposedNet(Generator& g)
      : c1(3, 6, 3, {.padding = 1, .generator = &g}), t1(6, 8, 2, {.stride = 2, .groups = 2, .generator = &g}),
        t2(8, 5, 3, {.padding = 1, .generator = &g}), fc(5, 3, {.generator = &g}) {
    register_module("c1", c1), register_module("in", in), register_module("t1", t1);
    register_module("t2", t2), register_module("fc", fc);
    randomize(g, {in.weight, in.bias});
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::relu(t2(F::relu(t1(F::relu(in(c1(x)))))));
    return fc(F::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
};

TEST(DependencyGraphLayers, ConvTranspose2dAndInstanceNormMatchTheZeroedNetwork) {
  Generator g(33);
  const Tensor x = randn({2, 3, 4, 4}, kFloat64, &g);
  auto [pruned, zeroed] = twins<TransposedNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  // t1's groups: 3 input channels (c1's, the norm's) and 4 output channels (t2's inputs) each
  const size_t grouped = group_of(graph, &pruned->c1, R::Out);
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{
           {&pruned->in, R::Norm}, {&pruned->t1, R::In}, {&pruned->t1, R::Out}, {&pruned->t2, R::In}})
    EXPECT_EQ(group_of(graph, m, role), grouped) << graph.report();
  EXPECT_EQ(graph.groups()[grouped].size, 2);
  const size_t out = group_of(graph, &pruned->t2, R::Out);
  EXPECT_EQ(group_of(graph, &pruned->fc, R::In), out);
  EXPECT_EQ(graph.groups()[out].size, 5);
  // t2's output channels are its weight's dim 1: their L1 is summed over dims 0, 2, 3
  const auto w2 = values(pruned->t2.weight), wf = values(pruned->fc.weight);
  const auto got = graph.importance(out);
  for (int64_t o = 0; o < 5; ++o) {
    double want = 0;
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t k = 0; k < 9; ++k) want += std::fabs(w2[(i * 5 + o) * 9 + k]);
    for (int64_t r = 0; r < 3; ++r) want += std::fabs(wf[r * 5 + o]);
    EXPECT_NEAR(got[o], want, 1e-9);
  }
  graph.prune_group(grouped, {1});
  const size_t out_now = group_of(graph, &pruned->t2, R::Out);
  graph.prune_group(out_now, {0, 3, 4});
  TransposedNet& z = *zeroed;
  zero_rows({z.c1.weight, z.c1.bias, z.in.weight, z.in.bias}, channels_of({0}, 3));
  zero_rows({z.t1.bias}, channels_of({0}, 4));
  zero_slices({z.t2.weight}, 1, {1, 2});
  zero_rows({z.t2.bias}, {1, 2});
  EXPECT_EQ(pruned->t1.weight.shape(), (Shape{3, 4, 2, 2}));
  EXPECT_EQ(pruned->t1.options.groups, 1);
  EXPECT_EQ(pruned->t2.weight.shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(pruned->in.num_features, 3);
  EXPECT_EQ(pruned->in.running_mean.shape(), (Shape{3}));
  EXPECT_EQ(pruned->fc.in_features, 3);
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

// x -> transposed convolution (1-d or 3-d, upsampling) -> mean over the positions -> fc
template <class Transposed, int64_t Dims> struct UpsamplingNet : nn::Module {
  Transposed t;
  nn::Linear fc;
  explicit UpsamplingNet(Generator& g) : t(3, 5, 2, {.stride = 2, .generator = &g}), fc(5, 3, {.generator = &g}) {
    register_module("t", t), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    std::vector<int64_t> positions;
    for (int64_t d = 0; d < Dims; ++d) positions.push_back(2 + d);
    return fc(F::relu(t(x)).mean(positions));
  }
};

template <class Net> void expect_transposed_output_pruned(const Tensor& x) {
  auto [pruned, zeroed] = twins<Net>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t out = group_of(graph, &pruned->t, R::Out);
  EXPECT_EQ(group_of(graph, &pruned->fc, R::In), out);
  EXPECT_EQ(graph.groups()[out].size, 5) << graph.report();
  graph.prune_group(out, {0, 2, 3});
  zero_slices({zeroed->t.weight}, 1, {1, 4});  // the outputs are dim 1 of (in, out, k...)
  zero_rows({zeroed->t.bias}, {1, 4});
  EXPECT_EQ(pruned->t.weight.size(1), 3);
  EXPECT_EQ(pruned->t.out_channels, 3);
  expect_same(*pruned, *zeroed, x);
  expect_trains(*pruned, x, 3);
}

TEST(DependencyGraphLayers, ConvTranspose1dAnd3dOutputsMatchTheZeroedNetwork) {
  Generator g(36);
  expect_transposed_output_pruned<UpsamplingNet<nn::ConvTranspose1d, 1>>(randn({2, 3, 4}, kFloat64, &g));
  expect_transposed_output_pruned<UpsamplingNet<nn::ConvTranspose3d, 3>>(randn({2, 3, 2, 3, 4}, kFloat64, &g));
}

// tokens -> Embedding -> fc1 -> mean over the tokens -> fc2
struct EmbeddingNet : nn::Module {
  nn::Embedding emb;
  nn::Linear fc1, fc2;
  explicit EmbeddingNet(Generator& g)
      : emb(10, 6, {.generator = &g}), fc1(6, 5, {.generator = &g}), fc2(5, 3, {.generator = &g}) {
    register_module("emb", emb), register_module("fc1", fc1), register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override { return fc2(F::relu(fc1(emb(x))).mean(1)); }
};

TEST(DependencyGraphLayers, EmbeddingFeaturesMatchTheZeroedNetwork) {
  const Tensor tokens = from_vector(std::vector<int64_t>{1, 4, 9, 0, 3, 3, 7, 2}).view({2, 4});
  auto [pruned, zeroed] = twins<EmbeddingNet>(tokens);
  compress::DependencyGraph graph(*pruned, tokens);
  const size_t features = group_of(graph, &pruned->emb, R::Out);
  EXPECT_EQ(group_of(graph, &pruned->fc1, R::In), features);
  EXPECT_TRUE(graph.groups()[features].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[features].size, 6);
  const auto keep = graph.prune(0.5);
  ASSERT_EQ(keep[features].size(), 3u);
  EmbeddingNet& z = *zeroed;
  zero_slices({z.emb.weight}, 1, complement(6, keep[features]));
  zero_rows({z.fc1.weight, z.fc1.bias}, complement(5, keep[group_of(graph, &pruned->fc1, R::Out)]));
  EXPECT_EQ(pruned->emb.weight.shape(), (Shape{10, 3}));
  EXPECT_EQ(pruned->emb.embedding_dim, 3);
  expect_same(*pruned, *zeroed, tokens);
  expect_trains(*pruned, tokens, 3);
}

TEST(DependencyGraphLayers, AFailedPruneLeavesGroupNormAsItWas) {
  Generator g(34);
  const Tensor x = randn({2, 2, 5, 6, 7}, kFloat64, &g);
  auto [net, reference] = twins<Conv3dNet>(x);
  compress::DependencyGraph graph(*net, x);
  net->fixed_width = true;
  EXPECT_TRUE(throws_with([&] { graph.prune_group(group_of(graph, &net->c1, R::Out), {0, 1}); },
                          {"nothing was pruned"}));
  EXPECT_EQ(net->gn.num_groups, 3);
  EXPECT_EQ(net->gn.num_channels, 6);
  EXPECT_EQ(net->c1.out_channels, 6);
  EXPECT_TRUE(all_close(net->gn.weight, values(reference->gn.weight), 0, 0));
  EXPECT_TRUE(all_close(net->c2.weight, values(reference->c2.weight), 0, 0));
  expect_same(*net, *reference, x);
}

// Embedding -> transpose to (N, C, T) -> Conv1d: the channels are followed through the transpose
struct PermutedNet : nn::Module {
  nn::Embedding emb;
  nn::Conv1d conv;
  nn::Linear fc;
  explicit PermutedNet(Generator& g)
      : emb(10, 6, {.generator = &g}), conv(6, 4, 3, {.padding = 1, .generator = &g}), fc(4, 3, {.generator = &g}) {
    register_module("emb", emb), register_module("conv", conv), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override { return fc(F::relu(conv(emb(x).transpose(1, 2))).mean(2)); }
};

TEST(DependencyGraphLayers, TransposedChannelsAreFollowedIntoTheConvolution) {
  const Tensor tokens = from_vector(std::vector<int64_t>{1, 4, 9, 0, 3, 3}).view({2, 3});
  auto [pruned, zeroed] = twins<PermutedNet>(tokens);
  compress::DependencyGraph graph(*pruned, tokens);
  const size_t emb = group_of(graph, &pruned->emb, R::Out);
  EXPECT_TRUE(graph.groups()[emb].prunable()) << graph.report();
  EXPECT_EQ(group_of(graph, &pruned->conv, R::In), emb);
  graph.prune_group(emb, {0, 2, 3, 5});
  graph.prune_group(group_of(graph, &pruned->conv, R::Out), {0, 2});
  zero_slices({zeroed->emb.weight}, 1, {1, 4});
  zero_rows({zeroed->conv.weight, zeroed->conv.bias}, {1, 3});
  EXPECT_EQ(pruned->conv.weight.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(pruned->fc.in_features, 2);
  expect_same(*pruned, *zeroed, tokens);
}

// A Conv1d whose forward also reads a parameter of another layer: not a call of the layer alone,
// so it is walked op by op, where its inner conv2d is not followed.
struct GatedConv1d : nn::Conv1d {
  using nn::Conv1d::Conv1d;
  Tensor gate;
  Tensor forward(const Tensor& x) override { return nn::Conv1d::forward(x) * gate; }
};

struct GatedNet : nn::Module {
  nn::Conv1d c0;
  GatedConv1d c1;
  nn::Linear fc;
  explicit GatedNet(Generator& g)
      : c0(3, 5, 3, {.padding = 1, .generator = &g}), c1(5, 4, 3, {.padding = 1, .generator = &g}),
        fc(4, 2, {.generator = &g}) {
    register_module("c0", c0), register_module("c1", c1), register_module("fc", fc);
    c1.gate = register_parameter("gate", randn({1, 4, 1}, kFloat32, &g));
  }
  Tensor forward(const Tensor& x) override { return fc(F::relu(c1(F::relu(c0(x)))).mean(2)); }
};

TEST(DependencyGraphLayers, ALayerCallReadingAnotherTensorIsNotFollowedWhole) {
  Generator g(38);
  GatedNet net(g);
  compress::DependencyGraph graph(net, randn({2, 3, 6}, kFloat32, &g));
  expect_unprunable(graph, &net.c0, R::Out, "conv2d called outside");
}

}  // namespace
