// Traced dependency groups where a wrong grouping would cut the model silently: a reduction over
// the channels whose size equals a position dim's, layers sharing a weight, a layer whose result
// the model computes but does not return; and a prune whose smaller model fails its forward,
// which must leave the model (values, handles, gradients, sizes) and the groups as they were.
#include <algorithm>
#include <tuple>

#include "depgraph_testing.h"

using namespace strata;
using strata::testing::group_of;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using R = compress::ChannelRole;

namespace {

// A Linear whose weight is another layer's (weight tying).
struct TiedLinear : nn::Linear {
  using nn::Linear::Linear;
  void tie(const Tensor& w) {
    unregister("weight");
    weight = register_parameter("weight", w);
  }
};

}  // namespace

TEST(DependencyGraphSafety, ASumOverTheChannelsIsNotTakenForOneOverThePositions) {
  // h is (N, 4, 4, 5): summing its 4 channels gives (N, 4, 5), the shape a sum over its 4 rows
  // gives; fc then reads positions, not channels, and c's channels cannot go
  struct ChannelSum : nn::Module {
    nn::Conv2d c{3, 4, 1};
    nn::Linear fc{20, 2};
    ChannelSum() { register_module("c", c), register_module("fc", fc); }
    Tensor forward(const Tensor& x) override { return fc(F::relu(c(x)).sum({1}).flatten(1)); }
  } net;
  compress::DependencyGraph graph(net, randn({2, 3, 4, 5}));
  const auto& channels = graph.groups()[group_of(graph, &net.c, R::Out)];
  EXPECT_FALSE(channels.prunable()) << graph.report();
  EXPECT_NE(channels.unprunable_reason.find("'sum'"), std::string::npos) << graph.report();
  graph.prune(0.5);
  EXPECT_EQ(net.c.out_channels, 4);
  EXPECT_EQ(net.fc.in_features, 20);
}

TEST(DependencyGraphSafety, ReductionsAndExpandsMoveTheChannelDimWhereItLands) {
  // (N, T, D) features: a mean over the tokens moves them from dim 2 to dim 1, an expand that
  // adds a leading dim moves them back; each Linear reads the features of the one before
  struct Tokens : nn::Module {
    nn::Linear l1{3, 6}, l2{6, 5}, l3{5, 2};
    Tokens() { register_module("l1", l1), register_module("l2", l2), register_module("l3", l3); }
    Tensor forward(const Tensor& x) override {
      const Tensor pooled = F::relu(l1(x)).mean({1});  // (N, 6)
      return l3(F::relu(l2(pooled)).expand({4, x.size(0), l2.out_features}));
    }
  } net, zeroed;
  const Tensor x = randn({2, 7, 3});
  compress::DependencyGraph graph(net, x);
  const size_t first = group_of(graph, &net.l1, R::Out), second = group_of(graph, &net.l2, R::Out);
  EXPECT_EQ(group_of(graph, &net.l2, R::In), first) << graph.report();
  EXPECT_EQ(group_of(graph, &net.l3, R::In), second) << graph.report();
  EXPECT_TRUE(graph.groups()[first].prunable() && graph.groups()[second].prunable()) << graph.report();
  optim::SGD before(net.parameters(), {.lr = 0.1, .momentum = 0.9});
  F::mse_loss(net(x), zeros({4, 2, 2})).backward();
  before.step();
  zeroed.load_state_dict(net.state_dict());
  const Tensor handle = net.l2.weight;
  const auto keep = graph.prune(0.5);
  EXPECT_EQ(net.l2.weight.shape(), (Shape{3, 3}));
  // the parameters keep their handles; an optimizer made before pruning says its state is stale
  EXPECT_EQ(net.l2.weight.impl_ptr(), handle.impl_ptr());
  EXPECT_FALSE(net.l2.weight.grad().defined());
  F::mse_loss(net(x), zeros({4, 2, 2})).backward();
  EXPECT_TRUE(throws_with([&] { before.step(); }, {"momentum_buffer", "replaced after the optimizer was built"}));
  // the pruned model computes what the whole one computes with the removed features zeroed
  NoGradGuard no_grad;
  for (auto [layer, g, n] : {std::tuple{&zeroed.l1, first, 6}, std::tuple{&zeroed.l2, second, 5}})
    for (int64_t u = 0; u < n; ++u)
      if (!std::count(keep[g].begin(), keep[g].end(), u)) layer->weight.select(0, u).zero_(), layer->bias[u].zero_();
  EXPECT_TRUE(strata::testing::all_close(net(x), values(zeroed(x)), 1e-5, 1e-6));
}

TEST(DependencyGraphSafety, LayersSharingAWeightAreNotPruned) {
  struct Tied : nn::Module {
    nn::Linear l1{4, 4}, l3{4, 2};
    TiedLinear l2{4, 4};
    Tied() {
      register_module("l1", l1), register_module("l2", l2), register_module("l3", l3);
      l2.tie(l1.weight);
    }
    Tensor forward(const Tensor& x) override { return l3(F::relu(l2(F::relu(l1(x))))); }
  } net;
  ASSERT_EQ(net.l1.weight.impl_ptr(), net.l2.weight.impl_ptr());
  const Tensor x = randn({3, 4});
  compress::DependencyGraph graph(net, x);
  for (nn::Module* m : std::vector<nn::Module*>{&net.l1, &net.l2}) {
    const auto& group = graph.groups()[group_of(graph, m, R::Out)];
    EXPECT_NE(group.unprunable_reason.find("shares its parameter 'weight'"), std::string::npos) << graph.report();
  }
  graph.prune(0.5);
  EXPECT_EQ(net.l1.weight.shape(), (Shape{4, 4}));
  EXPECT_EQ(net(x).shape(), (Shape{3, 2}));
}

TEST(DependencyGraphSafety, AResultTheModelDoesNotReturnStillTiesWhatItReads) {
  // an auxiliary head kept aside (as for an auxiliary loss): it reads h's channels, so it
  // shrinks with them; its own outputs are a result and stay
  struct AuxHead : nn::Module {
    nn::Conv2d c{3, 6, 1}, head{6, 2, 1}, aux{6, 3, 1};
    Tensor aux_out;
    AuxHead() { register_module("c", c), register_module("head", head), register_module("aux", aux); }
    Tensor forward(const Tensor& x) override {
      const Tensor h = F::relu(c(x));
      aux_out = aux(h);
      return head(h);
    }
  } net;
  const Tensor x = randn({2, 3, 4, 4});
  compress::DependencyGraph graph(net, x);
  const size_t h = group_of(graph, &net.c, R::Out);
  EXPECT_EQ(group_of(graph, &net.aux, R::In), h) << graph.report();
  EXPECT_TRUE(graph.groups()[h].prunable()) << graph.report();
  EXPECT_FALSE(graph.groups()[group_of(graph, &net.aux, R::Out)].prunable()) << graph.report();
  graph.prune(0.5);
  EXPECT_EQ(net.aux.weight.shape(), (Shape{3, 3, 1, 1}));
  net(x);
  EXPECT_EQ(net.aux_out.shape(), (Shape{2, 3, 4, 4}));
}

TEST(DependencyGraphSafety, ALayerReadingADetachedResultKeepsItsProducer) {
  // the trace cannot see that head reads c's channels through the detach: c's result, which no
  // traced op reads, keeps its channels
  struct Detaching : nn::Module {
    nn::Conv2d c{3, 6, 1}, head{6, 2, 1};
    Detaching() { register_module("c", c), register_module("head", head); }
    Tensor forward(const Tensor& x) override { return head(F::relu(c(x)).detach()); }
  } net;
  compress::DependencyGraph graph(net, randn({2, 3, 4, 4}));
  const auto& channels = graph.groups()[group_of(graph, &net.c, R::Out)];
  EXPECT_NE(channels.unprunable_reason.find("does not return"), std::string::npos) << graph.report();
}

TEST(DependencyGraphSafety, ALayerOutsideTheModelIsNotFollowed) {
  // a Linear the model calls but does not register: pruning it would cut a layer the model does
  // not own, so the channels it reads stay
  nn::Linear outside{6, 2};
  struct Borrowing : nn::Module {
    nn::Linear l1{4, 6};
    nn::Linear* head;
    explicit Borrowing(nn::Linear* head) : head(head) { register_module("l1", l1); }
    Tensor forward(const Tensor& x) override { return (*head)(F::relu(l1(x))); }
  } net(&outside);
  compress::DependencyGraph graph(net, randn({2, 4}));
  const auto& hidden = graph.groups()[group_of(graph, &net.l1, R::Out)];
  EXPECT_NE(hidden.unprunable_reason.find("a linear called outside the model's nn::Linear layers"), std::string::npos)
      << graph.report();
}

TEST(DependencyGraphSafety, NoUnitThatHoldsAllOfALayersChannelsIsRemoved) {
  // a and b feed one group each of a grouped convolution: each unit is all of a's or all of b's
  // channels, which stay (a layer left with no channels); d's 4 channels feed 2 groups of grp2
  struct Branches : nn::Module {
    nn::Conv2d a{3, 3, 1}, b{3, 3, 1}, grp{6, 4, 1, {.groups = 2}}, d{3, 4, 1}, grp2{4, 4, 1, {.groups = 2}};
    nn::Conv2d head{8, 2, 1};
    Branches() {
      register_module("a", a), register_module("b", b), register_module("grp", grp);
      register_module("d", d), register_module("grp2", grp2), register_module("head", head);
    }
    Tensor forward(const Tensor& x) override {
      return head(cat({F::relu(grp(cat({a(x), b(x)}, 1))), F::relu(grp2(d(x)))}, 1));
    }
  } net;
  const Tensor x = randn({2, 3, 4, 4});
  compress::DependencyGraph graph(net, x);
  const size_t branches = group_of(graph, &net.a, R::Out), split = group_of(graph, &net.d, R::Out);
  EXPECT_EQ(group_of(graph, &net.b, R::Out), branches) << graph.report();
  EXPECT_EQ(graph.groups()[branches].size, 2);
  EXPECT_EQ(graph.groups()[split].size, 2);
  const auto keep = graph.select(0.5);
  EXPECT_EQ(keep[branches], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(keep[split].size(), 1u);
  const auto global = graph.select(1, {.global = true});  // only the split group has a unit to spare
  EXPECT_EQ(global[branches].size(), 2u);
  EXPECT_EQ(global[split].size(), 1u);
  EXPECT_TRUE(throws_with([&] { graph.select(2, {.global = true}); }, {"asks for 2", "only 1 can go"}));
  EXPECT_TRUE(throws_with([&] { graph.select(1); }, {"asks for 1", "only 0 can go"}));  // a count per group
  EXPECT_TRUE(throws_with([&] { graph.prune_group(branches, {0}); }, {"every", "'b'"}));
  EXPECT_EQ(net.b.out_channels, 3);
  graph.prune(0.5);
  EXPECT_EQ(net.a.out_channels, 3);
  EXPECT_EQ(net.b.out_channels, 3);
  EXPECT_EQ(net.d.out_channels, 2);
  EXPECT_EQ(net.grp2.options.groups, 1);
  EXPECT_EQ(net(x).shape(), (Shape{2, 2, 4, 4}));
}

TEST(DependencyGraphSafety, APruneWhoseModelFailsLeavesEverythingAsItWas) {
  // the forward views h with a hard-coded channel count, which only the unpruned model has
  struct HardCoded : nn::Module {
    nn::Conv2d c{3, 4, 1}, head{4, 2, 1};
    nn::BatchNorm2d bn{4};
    HardCoded() { register_module("c", c), register_module("bn", bn), register_module("head", head); }
    Tensor forward(const Tensor& x) override {
      return head(F::relu(bn(c(x))).view({x.size(0), 4, x.size(2), x.size(3)}));
    }
  } net;
  const Tensor x = randn({2, 3, 4, 4});
  net(x).sum().backward();  // gradients and batch norm statistics to keep
  const Tensor handle = net.c.weight;
  const auto weight = values(net.c.weight), grad = values(net.c.weight.grad()), mean = values(net.bn.running_mean);
  compress::DependencyGraph graph(net, x);
  const size_t h = group_of(graph, &net.c, R::Out);
  ASSERT_TRUE(graph.groups()[h].prunable()) << graph.report();
  EXPECT_TRUE(throws_with([&] { graph.prune(0.5); }, {"nothing was pruned", "view"}));
  EXPECT_TRUE(throws_with([&] { graph.prune_group(h, {0, 1}); }, {"nothing was pruned"}));
  EXPECT_EQ(net.c.weight.impl_ptr(), handle.impl_ptr());
  EXPECT_EQ(values(net.c.weight), weight);
  ASSERT_TRUE(net.c.weight.grad().defined());
  EXPECT_EQ(values(net.c.weight.grad()), grad);
  EXPECT_EQ(values(net.bn.running_mean), mean);
  EXPECT_EQ(net.c.out_channels, 4);
  EXPECT_EQ(net.bn.num_features, 4);
  EXPECT_EQ(net.head.weight.shape(), (Shape{2, 4, 1, 1}));
  EXPECT_EQ(graph.groups()[h].size, 4);
  EXPECT_EQ(net(x).shape(), (Shape{2, 2, 4, 4}));
}
