// Traced dependency groups at their limits: ops the tracer does not know and tensors it cannot
// follow make their groups unprunable with the reason, the rest still prunes; protected layers,
// per-group and global ratios (against a ranking computed here), LayerNorm features; bad
// arguments raise; the trace leaves the model's mode and statistics as they were.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "depgraph_testing.h"

using namespace strata;
using strata::testing::group_of;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using R = compress::ChannelRole;

namespace {

// c1 -> softmax over the channels -> c2 -> times a free parameter -> c3 -> bn -> mean -> fc
struct Unusual : nn::Module {
  nn::Conv2d c1, c2, c3;
  nn::BatchNorm2d bn{5};
  nn::Linear fc;
  Tensor scale;
  explicit Unusual(Generator& g)
      : c1(3, 6, 3, {.generator = &g}), c2(6, 4, 1, {.generator = &g}), c3(4, 5, 1, {.generator = &g}),
        fc(5, 2, {.generator = &g}) {
    register_module("c1", c1), register_module("c2", c2), register_module("c3", c3);
    register_module("bn", bn), register_module("fc", fc);
    scale = register_parameter("scale", randn({1, 4, 1, 1}, kFloat32, &g));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor k = F::relu(c2(F::softmax(c1(x), 1))) * scale;
    return fc(F::relu(bn(c3(k))).mean({2, 3}));
  }
};

// l1 -> LayerNorm -> relu -> l2 -> relu -> l3
struct Mlp : nn::Module {
  nn::Linear l1, l2, l3;
  nn::LayerNorm ln{8};
  explicit Mlp(Generator& g) : l1(6, 8, {.generator = &g}), l2(8, 5, {.generator = &g}), l3(5, 3, {.generator = &g}) {
    register_module("l1", l1), register_module("ln", ln), register_module("l2", l2), register_module("l3", l3);
  }
  Tensor forward(const Tensor& x) override { return l3(F::relu(l2(F::relu(ln(l1(x)))))); }
};

double l1_row(const Tensor& w, int64_t r) {
  double s = 0;
  for (double v : values(w.select(0, r))) s += std::fabs(v);
  return s;
}

double l1_column(const Tensor& w, int64_t c) { return l1_row(w.transpose(0, 1).contiguous(), c); }

}  // namespace

TEST(DependencyGraphLimits, WhatTheTracerCannotFollowIsNotPruned) {
  Generator g(30);
  Unusual net(g);
  const Tensor x = randn({2, 3, 5, 5}, kFloat32, &g);
  const auto mean_before = values(net.bn.running_mean);
  compress::DependencyGraph graph(net, x);
  // the trace leaves the model as it was: training mode, batch norm statistics
  EXPECT_TRUE(net.is_training() && net.bn.is_training());
  EXPECT_EQ(values(net.bn.running_mean), mean_before);

  const auto& softmaxed = graph.groups()[group_of(graph, &net.c1, R::Out)];
  EXPECT_FALSE(softmaxed.prunable());
  EXPECT_NE(softmaxed.unprunable_reason.find("'softmax'"), std::string::npos) << softmaxed.to_string();
  const auto& scaled = graph.groups()[group_of(graph, &net.c2, R::Out)];
  EXPECT_NE(scaled.unprunable_reason.find("parameter used outside its layer"), std::string::npos)
      << scaled.to_string();
  const size_t tail = group_of(graph, &net.c3, R::Out);
  EXPECT_TRUE(graph.groups()[tail].prunable()) << graph.report();
  EXPECT_EQ(group_of(graph, &net.fc, R::In), tail);  // through bn, relu and the mean over positions
  EXPECT_TRUE(throws_with([&] { graph.prune_group(group_of(graph, &net.c1, R::Out), {0, 1}); },
                          {"cannot be pruned", "softmax"}));

  graph.prune(0.4);  // only the last group: round(2.0) of its 5 channels
  EXPECT_EQ(net.c1.weight.shape(), (Shape{6, 3, 3, 3}));
  EXPECT_EQ(net.c2.weight.shape(), (Shape{4, 6, 1, 1}));
  EXPECT_EQ(net.c3.weight.shape(), (Shape{3, 4, 1, 1}));
  EXPECT_EQ(net.bn.num_features, 3);
  EXPECT_EQ(net.fc.weight.shape(), (Shape{2, 3}));
  EXPECT_EQ(net(x).shape(), (Shape{2, 2}));
}

TEST(DependencyGraphLimits, LayerWeightsUsedWithOtherTensorsAreNotFollowed) {
  // l2's weight with a bias of another owner, called without l2: cutting l2's rows would leave
  // the bias whole, so l1's group, which l2 reads, is not pruned
  struct Borrowed : nn::Module {
    nn::Linear l1{4, 6}, l2{6, 3};
    Tensor other_bias;
    Borrowed() {
      register_module("l1", l1), register_module("l2", l2);
      other_bias = register_parameter("other_bias", zeros({3}));
    }
    Tensor forward(const Tensor& x) override { return F::linear(F::relu(l1(x)), l2.weight, other_bias); }
  } net;
  compress::DependencyGraph graph(net, randn({2, 4}));
  const auto& hidden = graph.groups()[group_of(graph, &net.l1, R::Out)];
  EXPECT_NE(hidden.unprunable_reason.find("a Linear computing with weights not its own"), std::string::npos)
      << graph.report();
}

TEST(DependencyGraphLimits, ABroadcastChannelTiesNothing) {
  // a spatial gate: one channel broadcast over h's six; h's group still prunes
  struct SpatialGate : nn::Module {
    nn::Conv2d c{3, 6, 1}, gate{6, 1, 1}, head{6, 2, 1};
    SpatialGate() { register_module("c", c), register_module("gate", gate), register_module("head", head); }
    Tensor forward(const Tensor& x) override {
      const Tensor h = F::relu(c(x));
      return head(h * F::sigmoid(gate(h)));
    }
  } net;
  const Tensor x = randn({2, 3, 4, 4});
  compress::DependencyGraph graph(net, x);
  const size_t h = group_of(graph, &net.c, R::Out);
  EXPECT_EQ(group_of(graph, &net.gate, R::In), h);
  EXPECT_EQ(group_of(graph, &net.head, R::In), h);
  EXPECT_TRUE(graph.groups()[h].prunable()) << graph.report();
  EXPECT_NE(graph.groups()[group_of(graph, &net.gate, R::Out)].unprunable_reason.find("broadcast by op 'mul'"),
            std::string::npos) << graph.report();
  graph.prune(0.5);
  EXPECT_EQ(net.gate.weight.shape(), (Shape{1, 3, 1, 1}));
  EXPECT_EQ(net(x).shape(), (Shape{2, 2, 4, 4}));
}

TEST(DependencyGraphLimits, GlobalRankingAgainstSumsComputedHere) {
  Generator g(31);
  Mlp net(g);
  {
    NoGradGuard no_grad;  // a LayerNorm weight that is not all ones
    net.ln.weight.copy_(rand({8}, kFloat32, &g) + 0.5);
  }
  const Tensor x = randn({4, 6}, kFloat32, &g);
  compress::DependencyGraph graph(net, x);
  const size_t hidden = group_of(graph, &net.l1, R::Out), second = group_of(graph, &net.l2, R::Out);
  EXPECT_EQ(group_of(graph, &net.ln, R::Norm), hidden);
  EXPECT_EQ(group_of(graph, &net.l2, R::In), hidden);
  std::vector<std::tuple<double, size_t, int64_t>> all;  // (score, group, unit)
  const auto gamma = values(net.ln.weight);
  for (int64_t u = 0; u < 8; ++u)
    all.emplace_back(l1_row(net.l1.weight, u) + std::fabs(gamma[u]) + l1_column(net.l2.weight, u), hidden, u);
  for (int64_t u = 0; u < 5; ++u)
    all.emplace_back(l1_row(net.l2.weight, u) + l1_column(net.l3.weight, u), second, u);
  std::sort(all.begin(), all.end());
  const auto keep = graph.select(4, {.global = true});
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [score, group, unit] = all[i];
    const auto& kept = keep[group];
    EXPECT_EQ(std::count(kept.begin(), kept.end(), unit) == 0, i < 4) << "rank " << i;
  }
  graph.prune(4, {.global = true});
  const int64_t hidden_left = static_cast<int64_t>(keep[hidden].size());
  EXPECT_EQ(net.ln.normalized_shape, (Shape{hidden_left}));
  EXPECT_EQ(net.ln.weight.shape(), (Shape{hidden_left}));
  EXPECT_EQ(net.l2.weight.shape(), (Shape{static_cast<int64_t>(keep[second].size()), hidden_left}));
  EXPECT_EQ(net(x).shape(), (Shape{4, 3}));
}

TEST(DependencyGraphLimits, ProtectedLayersAndPerGroupRatios) {
  Generator g(32);
  Mlp net(g);
  const Tensor x = randn({4, 6}, kFloat32, &g);
  compress::DependencyGraph guarded(net, x, {.protected_layers = {&net.l2}});
  const auto& protected_group = guarded.groups()[group_of(guarded, &net.l2, R::Out)];
  EXPECT_NE(protected_group.unprunable_reason.find("'l2' is a protected layer"), std::string::npos);
  EXPECT_TRUE(guarded.groups()[group_of(guarded, &net.l1, R::Out)].prunable());

  compress::DependencyGraph graph(net, x);
  const auto keep = graph.prune(0.0, {.ratios = {{&net.l1, 0.5}}});  // 4 of l1's 8, none of l2's
  EXPECT_EQ(net.l1.out_features, 4);
  EXPECT_EQ(net.l2.out_features, 5);
  EXPECT_EQ(net.l2.in_features, 4);
  // a fraction leaves each group at least min_units; a count that cannot be met raises
  graph.prune(0.9, {.min_units = 2});
  EXPECT_EQ(net.l1.out_features, 2);
  EXPECT_TRUE(throws_with([&] { graph.prune(1, {.min_units = 2}); }, {"asks for 1", "keeps 2"}));
}

TEST(DependencyGraphLimits, BadArgumentsRaise) {
  Generator g(33);
  Mlp net(g);
  const Tensor x = randn({4, 6}, kFloat32, &g);
  compress::DependencyGraph graph(net, x);
  const size_t hidden = group_of(graph, &net.l1, R::Out);
  EXPECT_TRUE(throws_with([&] { graph.prune_group(hidden, {}); }, {"keep at least one"}));
  EXPECT_TRUE(throws_with([&] { graph.prune_group(hidden, {0, 8}); }, {"unit 8 is out of range"}));
  EXPECT_TRUE(throws_with([&] { graph.prune_group(hidden, {1, 1}); }, {"listed twice"}));
  EXPECT_TRUE(throws_with([&] { graph.prune_group(99, {0}); }, {"group 99 is out of range"}));
  EXPECT_TRUE(throws_with([&] { graph.select(0.5, {.min_units = 0}); }, {"min_units"}));
  EXPECT_TRUE(throws_with([&] { graph.select(0.5, {.global = true, .ratios = {{&net.l1, 0.1}}}); }, {"global"}));
  EXPECT_TRUE(throws_with([&] { graph.select(12, {.global = true}); }, {"asks for 12"}));
  EXPECT_TRUE(throws_with([&] { graph.select(0.5, {.ratios = {{&net.ln, 0.1}}}); }, {"no traced group holds"}));
  EXPECT_EQ(net.l1.out_features, 8);  // nothing changed
  nn::Linear stranger{6, 8};
  EXPECT_TRUE(throws_with([&] { compress::DependencyGraph(net, x, {.protected_layers = {&stranger}}); },
                          {"protected layer", "not a module of the model"}));

  struct Detached : nn::Module {
    Tensor forward(const Tensor& x) override { return x.detach() * 2.0; }
  } detached;
  EXPECT_TRUE(throws_with([&] { compress::DependencyGraph(detached, x); }, {"does not depend on its input"}));
}
