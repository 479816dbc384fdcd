// Traced dependency groups: a residual network (plain and fused residual adds), a squeeze-
// excitation gate, a depthwise-separable branch with a grouped convolution and a concatenation,
// flattened into a Linear.
// After pruning, each model computes what its twin computes with the same channels zeroed by
// hand (float64, 1e-12); the groups found are the ones the architecture implies; importance
// against sums computed here; the pruned models train.
#include <algorithm>
#include <cmath>

#include "depgraph_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::channels_of;
using strata::testing::complement;
using strata::testing::expect_trains;
using strata::testing::group_of;
using strata::testing::twins;
using strata::testing::zero_rows;
using strata::testing::values;
namespace F = strata::nn::functional;

namespace {

// stem -> [c1 -> c2] + residual -> [c3 -> c4, residual fused into bn4] -> pool -> fc
struct ResidualNet : nn::Module {
  nn::Conv2d stem, c1, c2, c3, c4;
  nn::BatchNorm2d bn0{8}, bn1{6}, bn2{8}, bn3{5}, bn4{8};
  nn::Linear fc;
  explicit ResidualNet(Generator& g)
      : stem(3, 8, 3, {.padding = 1, .generator = &g}), c1(8, 6, 3, {.padding = 1, .generator = &g}),
        c2(6, 8, 3, {.padding = 1, .generator = &g}), c3(8, 5, 1, {.generator = &g}),
        c4(5, 8, 3, {.padding = 1, .generator = &g}), fc(8, 4, {.generator = &g}) {
    register_module("stem", stem), register_module("bn0", bn0), register_module("c1", c1);
    register_module("bn1", bn1), register_module("c2", c2), register_module("bn2", bn2);
    register_module("c3", c3), register_module("bn3", bn3), register_module("c4", c4);
    register_module("bn4", bn4), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::relu(bn0(stem(x)));
    const Tensor y = F::relu(bn2(c2(F::relu(bn1(c1(h))))) + h);
    const Tensor z = bn4.forward_relu(c4(F::relu(bn3(c3(y)))), y);
    return fc(F::adaptive_avg_pool2d(z, {1, 1}).flatten(1));
  }
};

// a -> depthwise -> grouped (2 groups) ; cat with a branch b from the input -> 1x1 mix -> pool,
// flatten -> fc
struct SeparableNet : nn::Module {
  nn::Conv2d a, dw, grp, b, mix;
  nn::BatchNorm2d bna{6}, bndw{6};
  nn::Linear fc;
  explicit SeparableNet(Generator& g)
      : a(3, 6, 3, {.padding = 1, .generator = &g}), dw(6, 6, 3, {.padding = 1, .groups = 6, .generator = &g}),
        grp(6, 4, 1, {.groups = 2, .generator = &g}), b(3, 5, 3, {.padding = 1, .generator = &g}),
        mix(9, 4, 1, {.generator = &g}), fc(4 * 2 * 2, 3, {.generator = &g}) {
    register_module("a", a), register_module("bna", bna), register_module("dw", dw);
    register_module("bndw", bndw), register_module("grp", grp), register_module("b", b);
    register_module("mix", mix), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor p = F::relu(grp(F::relu(bndw(dw(F::relu(bna(a(x))))))));
    const Tensor m = F::relu(mix(cat({p, F::relu(b(x))}, 1)));
    return fc(F::avg_pool2d(m, 2).flatten(1));
  }
};

}  // namespace

TEST(DependencyGraph, ResidualNetworkGroups) {
  Generator g(20);
  const Tensor x = randn({2, 3, 6, 6}, kFloat64, &g);
  auto [net, unused] = twins<ResidualNet>(x);
  const compress::DependencyGraph graph(*net, x);
  using R = compress::ChannelRole;
  // the residual stream: every layer writing or reading it, one channel index throughout
  const size_t stream = group_of(graph, &net->stem, R::Out);
  const auto& s = graph.groups()[stream];
  EXPECT_TRUE(s.prunable()) << s.to_string();
  EXPECT_EQ(s.size, 8);
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{{&net->bn0, R::Norm}, {&net->c1, R::In},
                                                                {&net->c2, R::Out}, {&net->bn2, R::Norm},
                                                                {&net->c3, R::In}, {&net->c4, R::Out},
                                                                {&net->bn4, R::Norm}, {&net->fc, R::In}})
    EXPECT_EQ(group_of(graph, m, role), stream) << graph.report();
  EXPECT_EQ(s.members.size(), 9u);
  const size_t inner = group_of(graph, &net->c1, R::Out);
  EXPECT_NE(inner, stream);
  EXPECT_EQ(group_of(graph, &net->c2, R::In), inner);
  EXPECT_EQ(graph.groups()[inner].size, 6);
  // the model's input and output channels stay
  EXPECT_NE(graph.groups()[group_of(graph, &net->stem, R::In)].unprunable_reason.find("input"), std::string::npos);
  EXPECT_NE(graph.groups()[group_of(graph, &net->fc, R::Out)].unprunable_reason.find("output"), std::string::npos);
  // importance: L1 of c1's filters, |bn1's weight| and c2's input columns, summed here
  const auto w1 = values(net->c1.weight), gamma = values(net->bn1.weight), w2 = values(net->c2.weight);
  const auto got = graph.importance(inner, compress::Importance::L1);
  for (int64_t u = 0; u < 6; ++u) {
    double want = std::fabs(gamma[u]);
    for (int64_t i = 0; i < 8 * 9; ++i) want += std::fabs(w1[u * 72 + i]);
    for (int64_t o = 0; o < 8; ++o)
      for (int64_t k = 0; k < 9; ++k) want += std::fabs(w2[(o * 6 + u) * 9 + k]);
    EXPECT_NEAR(got[u], want, 1e-9);
  }
}

TEST(DependencyGraph, PrunedResidualNetworkMatchesTheZeroedOne) {
  Generator g(22);
  const Tensor x = randn({3, 3, 6, 6}, kFloat64, &g);
  auto [pruned, zeroed] = twins<ResidualNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t stream = group_of(graph, &pruned->stem, compress::ChannelRole::Out);
  const size_t inner = group_of(graph, &pruned->c1, compress::ChannelRole::Out);
  const auto keep = graph.prune(0.4);  // round(3.2) of the stream's 8, round(2.4) of 6, 2 of c3's 5
  ASSERT_EQ(keep[stream].size(), 5u);
  ASSERT_EQ(keep[inner].size(), 4u);
  ResidualNet& z = *zeroed;
  const auto gone = complement(8, keep[stream]), gone_inner = complement(6, keep[inner]);
  zero_rows({z.stem.weight, z.stem.bias, z.bn0.weight, z.bn0.bias, z.c2.weight, z.c2.bias, z.bn2.weight, z.bn2.bias,
             z.c4.weight, z.c4.bias, z.bn4.weight, z.bn4.bias}, gone);
  zero_rows({z.c1.weight, z.c1.bias, z.bn1.weight, z.bn1.bias}, gone_inner);
  zero_rows({z.c3.weight, z.c3.bias, z.bn3.weight, z.bn3.bias},
            complement(5, keep[group_of(graph, &pruned->c4, compress::ChannelRole::In)]));
  // the graph was traced again: the groups describe the smaller model
  EXPECT_EQ(graph.groups()[group_of(graph, &pruned->stem, compress::ChannelRole::Out)].size, 5);

  EXPECT_EQ(pruned->stem.weight.shape(), (Shape{5, 3, 3, 3}));
  EXPECT_EQ(pruned->c1.weight.shape(), (Shape{4, 5, 3, 3}));
  EXPECT_EQ(pruned->c2.weight.shape(), (Shape{5, 4, 3, 3}));
  EXPECT_EQ(pruned->c3.weight.shape(), (Shape{3, 5, 1, 1}));
  EXPECT_EQ(pruned->bn4.running_mean.shape(), (Shape{5}));
  EXPECT_EQ(pruned->fc.weight.shape(), (Shape{4, 5}));
  EXPECT_EQ(pruned->fc.in_features, 5);
  for (bool train : {false, true}) {
    pruned->train(train), zeroed->train(train);
    NoGradGuard no_grad;
    EXPECT_TRUE(all_close((*pruned)(x), values((*zeroed)(x)), 1e-12, 1e-12)) << "train " << train;
  }
  expect_trains(*pruned, x, 4);
}

TEST(DependencyGraph, DepthwiseGroupedAndConcatMatchTheZeroedNetwork) {
  Generator g(23);
  const Tensor x = randn({2, 3, 4, 4}, kFloat64, &g);
  auto [pruned, zeroed] = twins<SeparableNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  using R = compress::ChannelRole;
  // a, the depthwise conv and the grouped conv's 2 groups (3 input channels each) are one group
  // of 2 units; the grouped conv's outputs are the mix's inputs 0..3, b's are its inputs 4..8
  const size_t chain = group_of(graph, &pruned->a, R::Out);
  EXPECT_EQ(graph.groups()[chain].size, 2) << graph.report();
  for (nn::Module* m : std::vector<nn::Module*>{&pruned->dw, &pruned->grp})
    EXPECT_EQ(group_of(graph, m, R::Out), chain) << graph.report();
  const size_t branch = group_of(graph, &pruned->b, R::Out);
  EXPECT_EQ(graph.groups()[branch].size, 5);
  const auto& members = graph.groups()[branch].members;
  const auto mix_in = std::find_if(members.begin(), members.end(),
                                   [&](const auto& m) { return m.module == &pruned->mix && m.role == R::In; });
  ASSERT_NE(mix_in, members.end()) << graph.report();
  EXPECT_EQ(mix_in->channels, 5);
  const size_t head = group_of(graph, &pruned->mix, R::Out);
  EXPECT_EQ(group_of(graph, &pruned->fc, R::In), head);
  EXPECT_EQ(graph.groups()[head].size, 4);  // each a block of 4 of fc's features

  const auto keep = graph.select(1);  // one unit of each prunable group
  graph.prune(1);
  SeparableNet& z = *zeroed;
  const auto gone_chain = complement(2, keep[chain]);
  zero_rows({z.a.weight, z.a.bias, z.bna.weight, z.bna.bias, z.dw.weight, z.dw.bias, z.bndw.weight, z.bndw.bias},
            channels_of(gone_chain, 3));
  zero_rows({z.grp.weight, z.grp.bias}, channels_of(gone_chain, 2));
  zero_rows({z.b.weight, z.b.bias}, complement(5, keep[branch]));
  zero_rows({z.mix.weight, z.mix.bias}, complement(4, keep[head]));

  EXPECT_EQ(pruned->a.weight.shape(), (Shape{3, 3, 3, 3}));
  EXPECT_EQ(pruned->dw.weight.shape(), (Shape{3, 1, 3, 3}));
  EXPECT_EQ(pruned->dw.options.groups, 3);
  EXPECT_EQ(pruned->grp.weight.shape(), (Shape{2, 3, 1, 1}));
  EXPECT_EQ(pruned->grp.options.groups, 1);
  EXPECT_EQ(pruned->grp.in_channels, 3);
  EXPECT_EQ(pruned->mix.weight.shape(), (Shape{3, 6, 1, 1}));  // 2 from grp + 4 from b
  EXPECT_EQ(pruned->fc.weight.shape(), (Shape{3, 12}));
  for (bool train : {false, true}) {
    pruned->train(train), zeroed->train(train);
    NoGradGuard no_grad;
    EXPECT_TRUE(all_close((*pruned)(x), values((*zeroed)(x)), 1e-12, 1e-12)) << "train " << train;
  }
  expect_trains(*pruned, x, 3);
}

namespace {

// A squeeze-excitation gate: h = relu(c(x)); h * sigmoid(fc2(relu(fc1(mean(h))))), viewed as
// (N, C, 1, 1) and broadcast over the positions; then a 1x1 head and a mean.
struct SqueezeExcite : nn::Module {
  nn::Conv2d c, head;
  nn::Linear fc1, fc2;
  explicit SqueezeExcite(Generator& g)
      : c(3, 6, 3, {.padding = 1, .generator = &g}), head(6, 2, 1, {.generator = &g}), fc1(6, 3, {.generator = &g}),
        fc2(3, 6, {.generator = &g}) {
    register_module("c", c), register_module("fc1", fc1), register_module("fc2", fc2), register_module("head", head);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = F::relu(c(x));
    const Tensor gate = F::sigmoid(fc2(F::relu(fc1(h.mean({2, 3})))));
    return head(h * gate.view({x.size(0), fc2.out_features, 1, 1})).mean({2, 3});
  }
};

}  // namespace

TEST(DependencyGraph, SqueezeExciteGateTiesItsChannelsToTheGatedOnes) {
  Generator g(24);
  const Tensor x = randn({2, 3, 5, 5}, kFloat64, &g);
  auto [pruned, zeroed] = twins<SqueezeExcite>(x);
  compress::DependencyGraph graph(*pruned, x);
  using R = compress::ChannelRole;
  const size_t gated = group_of(graph, &pruned->c, R::Out), squeezed = group_of(graph, &pruned->fc1, R::Out);
  for (auto [m, role] : std::vector<std::pair<nn::Module*, R>>{{&pruned->fc1, R::In}, {&pruned->fc2, R::Out},
                                                                {&pruned->head, R::In}})
    EXPECT_EQ(group_of(graph, m, role), gated) << graph.report();
  EXPECT_EQ(group_of(graph, &pruned->fc2, R::In), squeezed);
  const auto keep = graph.prune(0.5);
  SqueezeExcite& z = *zeroed;
  zero_rows({z.c.weight, z.c.bias}, complement(6, keep[gated]));
  zero_rows({z.fc1.weight, z.fc1.bias}, complement(3, keep[squeezed]));
  EXPECT_EQ(pruned->fc2.weight.shape(), (Shape{3, 1}));  // round(1.5) = 2 of fc1's 3 go, half to even
  EXPECT_EQ(pruned->head.weight.shape(), (Shape{2, 3, 1, 1}));
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close((*pruned)(x), values((*zeroed)(x)), 1e-12, 1e-12));
}
