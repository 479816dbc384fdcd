// Traced dependency groups through RMSNorm (its weight goes with the features it normalizes;
// the features that stay are normalized over themselves) and EmbeddingBag (its embedding_dim is
// an output like an Embedding's). The pruned RMSNorm model is checked against the original's
// weights with the kept features picked and normalized by hand in float64; the EmbeddingBag
// model against its twin with the removed features zeroed (1e-12). What stays unprunable is
// reported with the reason.
#include <cmath>

#include "depgraph_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::complement;
using strata::testing::expect_same;
using strata::testing::expect_trains;
using strata::testing::expect_unprunable;
using strata::testing::group_of;
using strata::testing::randomize;
using strata::testing::twins;
using strata::testing::values;
using strata::testing::zero_slices;
namespace F = strata::nn::functional;
using R = compress::ChannelRole;

namespace {

constexpr double kEps = 1e-6;

// x (N, 3, L) -> conv (6 channels) -> permute to (N, L, 6) -> RMSNorm -> mean over L -> fc
struct RMSNet : nn::Module {
  nn::Conv1d conv;
  nn::RMSNorm norm;
  nn::Linear fc;
  explicit RMSNet(Generator& g)
      : conv(3, 6, 1, {.generator = &g}), norm(6, {.eps = kEps}), fc(6, 3, {.generator = &g}) {
    register_module("conv", conv), register_module("norm", norm), register_module("fc", fc);
    randomize(g, {norm.weight});
  }
  Tensor forward(const Tensor& x) override { return fc(norm(conv(x).permute({0, 2, 1})).mean(1)); }
};

TEST(DependencyGraphFeatures, RMSNormFeaturesMatchTheKeptFeaturesNormalizedByHand) {
  Generator g(73);
  const Tensor x = randn({2, 3, 4}, kFloat64, &g);
  auto [pruned, original] = twins<RMSNet>(x);
  compress::DependencyGraph graph(*pruned, x);
  const size_t features = group_of(graph, &pruned->conv, R::Out);
  EXPECT_TRUE(graph.groups()[features].prunable()) << graph.report();
  EXPECT_EQ(group_of(graph, &pruned->norm, R::Norm), features);
  EXPECT_EQ(group_of(graph, &pruned->fc, R::In), features);
  const std::vector<int64_t> kept = {0, 2, 3, 5};
  graph.prune_group(features, kept);
  EXPECT_EQ(pruned->norm.normalized_shape, (Shape{4}));
  EXPECT_EQ(pruned->norm.weight.shape(), (Shape{4}));

  // the original's kept features, by hand: h (N, 6, L) of the conv, RMS over the kept four
  const std::vector<double> h = values(original->conv(x).detach());
  const std::vector<double> w = values(original->norm.weight), fw = values(original->fc.weight),
                            fb = values(original->fc.bias);
  const int64_t n = x.size(0), len = x.size(2);
  std::vector<double> want(static_cast<size_t>(n * 3), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t t = 0; t < len; ++t) {
      double squares = 0;
      for (int64_t c : kept) squares += std::pow(h[(b * 6 + c) * len + t], 2);
      const double scale = 1 / std::sqrt(squares / 4 + kEps);
      for (int64_t o = 0; o < 3; ++o)
        for (int64_t c : kept)
          want[b * 3 + o] += fw[o * 6 + c] * w[c] * h[(b * 6 + c) * len + t] * scale / static_cast<double>(len);
    }
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < 3; ++o) want[b * 3 + o] += fb[o];
  EXPECT_TRUE(all_close((*pruned)(x).detach(), want, 1e-12, 1e-12));
  expect_trains(*pruned, x, 3);
}

TEST(DependencyGraphFeatures, RMSNormOverTheChannelsAndAnotherDimIsReportedUnprunable) {
  struct Net : nn::Module {
    nn::Linear in;
    nn::RMSNorm norm;
    nn::Linear fc;
    explicit Net(Generator& g) : in(5, 4, {.generator = &g}), norm(Shape{3, 4}), fc(4, 2, {.generator = &g}) {
      register_module("in", in), register_module("norm", norm), register_module("fc", fc);
    }
    Tensor forward(const Tensor& x) override { return fc(norm(in(x)).mean(1)); }
  };
  Generator g(79);
  Net net(g);
  compress::DependencyGraph graph(net, randn({2, 3, 5}, kFloat32, &g));
  expect_unprunable(graph, &net.in, R::Out, "an RMSNorm over several dims");
}

// indices (N, 4) -> EmbeddingBag (max over each bag) -> relu -> fc; `scored` ends in a softmax
// over the bag's features before fc
struct BagNet : nn::Module {
  nn::EmbeddingBag bag;
  nn::Linear fc;
  bool scored = false;
  explicit BagNet(Generator& g)
      : bag(10, 6, {.mode = nn::EmbeddingBagMode::Max, .generator = &g}), fc(6, 3, {.generator = &g}) {
    register_module("bag", bag), register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor b = F::relu(bag(x));
    return fc(scored ? F::softmax(b, -1) : b);
  }
};

TEST(DependencyGraphFeatures, EmbeddingBagFeaturesMatchTheZeroedNetwork) {
  const Tensor bags = from_vector(std::vector<int64_t>{1, 4, 9, 0, 3, 3, 7, 2, 5, 8, 6, 1}).view({3, 4});
  auto [pruned, zeroed] = twins<BagNet>(bags);
  compress::DependencyGraph graph(*pruned, bags);
  const size_t features = group_of(graph, &pruned->bag, R::Out);
  EXPECT_TRUE(graph.groups()[features].prunable()) << graph.report();
  EXPECT_EQ(graph.groups()[features].size, 6);
  EXPECT_EQ(group_of(graph, &pruned->fc, R::In), features);
  const auto scores = graph.importance(features);
  for (int64_t c = 0; c < 6; ++c)
    EXPECT_NEAR(scores[c], (abs(pruned->bag.weight.select(1, c)).sum() + abs(pruned->fc.weight.select(1, c)).sum())
                               .item<double>(), 1e-9);
  const std::vector<int64_t> kept = {1, 2, 5};
  graph.prune_group(features, kept);
  zero_slices({zeroed->bag.weight}, 1, complement(6, kept));
  EXPECT_EQ(pruned->bag.embedding_dim, 3);
  EXPECT_EQ(pruned->bag.weight.shape(), (Shape{10, 3}));
  EXPECT_EQ(pruned->fc.in_features, 3);
  expect_same(*pruned, *zeroed, bags);
}

TEST(DependencyGraphFeatures, EmbeddingBagFeaturesUnderASoftmaxAreReportedUnprunable) {
  Generator g(83);
  BagNet net(g);
  net.scored = true;
  compress::DependencyGraph graph(net, from_vector(std::vector<int64_t>{1, 4, 9, 0}).view({2, 2}));
  expect_unprunable(graph, &net.bag, R::Out, "softmax");
}

}  // namespace
