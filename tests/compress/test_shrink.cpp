// Physical channel pruning: the shrunken conv+bn+conv, conv+flatten+linear and transformer MLP
// give the masked networks' outputs, have the expected parameter counts, train with an optimizer
// made afterwards; global selection against a ranking computed here; bad groups raise.
#include <algorithm>
#include <numeric>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

struct ConvNet : nn::Module {
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1;
  nn::Linear head;
  explicit ConvNet(Generator& g)
      : conv1(3, 8, 3, {.padding = 1, .generator = &g}), conv2(8, 4, 3, {.stride = 2, .padding = 1, .generator = &g}),
        bn1(8), head(4 * 3 * 3, 5, {.generator = &g}) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override {
    return head(nn::functional::relu(conv2(nn::functional::relu(bn1(conv1(x))))).flatten(1));
  }
  compress::ChannelGroup block() { return {&conv1, &bn1, {&conv2}}; }
  compress::ChannelGroup to_head() { return {&conv2, nullptr, {&head}}; }
};

// Two identical networks, their batch norm statistics moved by the same training batch.
std::pair<std::unique_ptr<ConvNet>, std::unique_ptr<ConvNet>> twins(const Tensor& x) {
  Generator ga(11), gb(11);
  auto a = std::make_unique<ConvNet>(ga), b = std::make_unique<ConvNet>(gb);
  NoGradGuard no_grad;
  (*a)(x), (*b)(x);
  return {std::move(a), std::move(b)};
}

// The k channels of smallest L1 filter norm, computed here.
std::vector<int64_t> kept_by_l1(const Tensor& weight, int64_t k) {
  const auto v = values(weight);
  const int64_t channels = weight.size(0), inner = weight.numel() / channels;
  std::vector<double> norms(channels, 0);
  for (size_t i = 0; i < v.size(); ++i) norms[i / inner] += std::fabs(v[i]);
  std::vector<int64_t> order(channels);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return norms[a] < norms[b]; });
  std::vector<int64_t> keep(order.begin() + k, order.end());
  std::sort(keep.begin(), keep.end());
  return keep;
}

}  // namespace

TEST(Shrink, ConvBatchNormConvMatchesTheMaskedNetwork) {
  Generator g(12);
  const Tensor x = randn({4, 3, 6, 6}, kFloat32, &g);
  auto [masked, shrunk] = twins(x);
  const auto keep = compress::select_channels({masked->block()}, 0.375);  // round(3) of 8 filters
  ASSERT_EQ(keep.size(), 1u);
  EXPECT_EQ(keep[0], kept_by_l1(masked->conv1.weight, 3));
  compress::mask_channels(masked->block(), keep[0]);
  compress::shrink_channels(shrunk->block(), keep[0]);

  EXPECT_EQ(shrunk->conv1.weight.shape(), (Shape{5, 3, 3, 3}));
  EXPECT_EQ(shrunk->conv2.weight.shape(), (Shape{4, 5, 3, 3}));
  EXPECT_EQ(shrunk->bn1.running_var.shape(), (Shape{5}));
  EXPECT_EQ(shrunk->num_parameters(), (5 * 27 + 5) + (5 + 5) + (4 * 5 * 9 + 4) + (36 * 5 + 5));
  for (bool train : {false, true}) {
    masked->train(train), shrunk->train(train);
    NoGradGuard no_grad;
    EXPECT_TRUE(all_close((*shrunk)(x), values((*masked)(x)), 1e-5, 1e-5)) << "train " << train;
  }
  // a shrunken network trains with an optimizer made afterwards
  shrunk->train();
  optim::AdamW opt(shrunk->parameters(), {.lr = 1e-2});
  const Tensor y = from_vector<int64_t>({0, 1, 2, 3});
  const double first = nn::functional::cross_entropy((*shrunk)(x), y).item<double>();
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    nn::functional::cross_entropy((*shrunk)(x), y).backward();
    opt.step();
  }
  EXPECT_LT(nn::functional::cross_entropy((*shrunk)(x), y).item<double>(), first);
}

TEST(Shrink, ConvIntoFlattenedLinearMatchesTheMaskedNetwork) {
  Generator g(13);
  const Tensor x = randn({2, 3, 6, 6}, kFloat32, &g);
  auto [masked, shrunk] = twins(x);
  masked->eval(), shrunk->eval();
  const std::vector<int64_t> keep{0, 3};  // of conv2's 4 channels; the head reads 9 positions each
  compress::mask_channels(masked->to_head(), keep);
  compress::shrink_channels(shrunk->to_head(), keep);
  EXPECT_EQ(shrunk->head.in_features, 18);
  EXPECT_EQ(shrunk->head.weight.shape(), (Shape{5, 18}));
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close((*shrunk)(x), values((*masked)(x)), 1e-5, 1e-5));
}

TEST(Shrink, TransformerMlpHiddenUnits) {
  Generator ga(14), gb(14), gx(15);
  nn::TransformerEncoderLayerOptions o{.dim_feedforward = 16, .dropout = 0, .activation = "gelu"};
  o.generator = &ga;
  nn::TransformerEncoderLayer masked(8, 2, o);
  o.generator = &gb;
  nn::TransformerEncoderLayer shrunk(8, 2, o);
  const compress::ChannelGroup mg{&masked.linear1, nullptr, {&masked.linear2}};
  const compress::ChannelGroup sg{&shrunk.linear1, nullptr, {&shrunk.linear2}};
  const auto keep = compress::select_channels({mg}, 6, {.importance = compress::Importance::L2});
  ASSERT_EQ(keep[0].size(), 10u);
  compress::mask_channels(mg, keep[0]);
  compress::shrink_channels(sg, keep[0]);
  EXPECT_EQ(shrunk.linear1.out_features, 10);
  EXPECT_EQ(shrunk.linear2.in_features, 10);
  EXPECT_EQ(masked.num_parameters() - shrunk.num_parameters(), 6 * (8 + 1) + 6 * 8);
  const Tensor x = randn({5, 2, 8}, kFloat32, &gx);
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close(shrunk(x), values(masked(x)), 1e-5, 1e-5));
}

TEST(Shrink, GlobalSelectionRanksAllGroupsTogether) {
  Generator g(16);
  auto nets = twins(randn({2, 3, 6, 6}, kFloat32, &g));
  ConvNet* net = nets.first.get();
  const auto s1 = values(compress::channel_importance(net->conv1.weight, compress::Importance::L1));
  const auto s2 = values(compress::channel_importance(net->conv2.weight, compress::Importance::L1));
  std::vector<std::pair<double, int64_t>> all;  // (score, 0..7 for conv1, 8..11 for conv2)
  for (int64_t c = 0; c < 8; ++c) all.emplace_back(s1[c], c);
  for (int64_t c = 0; c < 4; ++c) all.emplace_back(s2[c], 8 + c);
  std::sort(all.begin(), all.end());
  const auto keep = compress::prune_channels({net->block(), net->to_head()}, 5);
  std::vector<int64_t> gone;
  for (int64_t c = 0; c < 8; ++c)
    if (!std::count(keep[0].begin(), keep[0].end(), c)) gone.push_back(c);
  for (int64_t c = 0; c < 4; ++c)
    if (!std::count(keep[1].begin(), keep[1].end(), c)) gone.push_back(8 + c);
  std::vector<int64_t> want;
  for (int i = 0; i < 5; ++i) want.push_back(all[i].second);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(gone, want);
  EXPECT_EQ(net->conv1.out_channels + net->conv2.out_channels, 7);
  NoGradGuard no_grad;
  EXPECT_EQ((*net)(randn({2, 3, 6, 6}, kFloat32, &g)).shape(), (Shape{2, 5}));

  // min_channels holds a group back: conv2's scores made smallest, it keeps 3 of 4
  Generator g2(17);
  auto nets2 = twins(randn({2, 3, 6, 6}, kFloat32, &g2));
  ConvNet* net2 = nets2.first.get();
  const std::vector<Tensor> scores{arange(8, kFloat64) + 10.0, arange(4, kFloat64)};
  const auto k2 = compress::select_channels({net2->block(), net2->to_head()}, 4, {.min_channels = 3, .scores = scores});
  EXPECT_EQ(k2[0], (std::vector<int64_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(k2[1], (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(throws_with([&] { compress::select_channels({net2->to_head()}, 2, {.min_channels = 3}); },
                          {"only 1 can go"}));
}

TEST(Shrink, BadGroupsRaise) {
  Generator g(18);
  nn::Conv2d a(3, 8, 3), b(6, 4, 3), grouped(8, 8, 3, {.groups = 2});
  nn::BatchNorm2d bn(7);
  nn::Linear fc(8, 5), odd(10, 3);
  EXPECT_TRUE(throws_with([&] { compress::check_group({&a, nullptr, {&b}}); },
                          {"mismatched consecutive layers", "8 output channels", "6 input"}));
  EXPECT_TRUE(throws_with([&] { compress::check_group({&a, &bn, {&fc}}); }, {"norm", "7 features"}));
  EXPECT_TRUE(throws_with([&] { compress::check_group({&a, nullptr, {&odd}}); }, {"mismatched"}));
  EXPECT_TRUE(throws_with([&] { compress::check_group({&fc, nullptr, {&a}}); }, {"mismatched"}));
  EXPECT_TRUE(throws_with([&] { compress::check_group({&a, nullptr, {&grouped}}); }, {"groups=2"}));
  EXPECT_TRUE(throws_with([&] { compress::check_group({&bn, nullptr, {&a}}); }, {"nn::Conv2d or nn::Linear"}));
  EXPECT_TRUE(throws_with([&] { compress::check_group({&a, nullptr, {}}); }, {"no consumers"}));
  const compress::ChannelGroup ok{&a, nullptr, {&fc}};
  EXPECT_TRUE(throws_with([&] { compress::shrink_channels(ok, {0, 8}); }, {"channel 8 is out of range"}));
  EXPECT_TRUE(throws_with([&] { compress::shrink_channels(ok, {1, 1}); }, {"listed twice"}));
  EXPECT_TRUE(throws_with([&] { compress::shrink_channels(ok, {}); }, {"keep at least one"}));
  EXPECT_TRUE(throws_with([&] { compress::prune_channels({ok}, 9); }, {"amount=9"}));
  compress::l1_unstructured(fc, "weight", 2);
  EXPECT_TRUE(throws_with([&] { compress::shrink_channels(ok, {0}); }, {"pruning mask", "remove"}));
  EXPECT_EQ(a.out_channels, 8);  // nothing changed by the refused calls
}

TEST(Shrink, ALayerInTwoPlacesIsRefusedBeforeAnythingChanges) {
  Generator g(19);
  nn::Conv2d a(3, 8, 3, {.generator = &g}), c(3, 8, 3, {.generator = &g}), b(8, 4, 3, {.generator = &g});
  nn::BatchNorm2d bn(8);
  // listed twice, the consumer's input channels would be taken twice
  EXPECT_TRUE(throws_with([&] { compress::shrink_channels({&a, nullptr, {&b, &b}}, {0, 5}); }, {"listed twice"}));
  // a consumer (or a norm) in two groups: refused by the selection, before the first group shrinks
  EXPECT_TRUE(throws_with([&] { compress::prune_channels({{&a, nullptr, {&b}}, {&c, nullptr, {&b}}}, 0.25); },
                          {"consumer in two groups"}));
  nn::Conv2d b2(8, 4, 3, {.generator = &g});
  EXPECT_TRUE(throws_with([&] { compress::prune_channels({{&a, &bn, {&b}}, {&c, &bn, {&b2}}}, 0.25); },
                          {"norm of two groups"}));
  EXPECT_EQ(a.weight.shape(), (Shape{8, 3, 3, 3}));
  EXPECT_EQ(b.weight.shape(), (Shape{4, 8, 3, 3}));
  EXPECT_EQ(bn.running_mean.shape(), (Shape{8}));
}

TEST(Shrink, NaNScoresAreRemovedLast) {
  nn::Conv2d a(3, 4, 3), b(4, 2, 3);
  compress::ChannelSelection selection;
  selection.scores = {from_vector<double>({NAN, 1, 0.5, 2})};
  const auto keep = compress::select_channels({{&a, nullptr, {&b}}}, 2, selection);
  EXPECT_EQ(keep, (std::vector<std::vector<int64_t>>{{0, 3}}));
}
