// Mask pruning against rankings computed here (sorting |w| and per-channel norms written out in
// loops), torch.nn.utils.prune's amount rounding and iterative semantics, gradient masking,
// remove, loading a pruned checkpoint, and bad input (training: test_prune_hook.cpp).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "compress/prune_testing.h"
#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;
using strata::testing::zero_positions;

namespace {

// Indices of the k smallest |v| (v without ties, as random data are).
std::set<int64_t> smallest_abs(const std::vector<double>& v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return std::fabs(v[a]) < std::fabs(v[b]); });
  return {idx.begin(), idx.begin() + k};
}

bool has_key(const nn::Module& m, const std::string& key) { return m.state_dict().count(key) == 1; }

}  // namespace

TEST(Prune, AmountRoundsHalfToEvenAndChecksRange) {
  EXPECT_EQ(compress::Amount(0.5).of(5, "t"), 2);  // round(2.5) = 2, as Python's round
  EXPECT_EQ(compress::Amount(0.5).of(7, "t"), 4);  // round(3.5) = 4
  EXPECT_EQ(compress::Amount(0.3).of(20, "t"), 6);
  EXPECT_EQ(compress::Amount(3).of(3, "t"), 3);
  EXPECT_TRUE(throws_with([] { compress::Amount(4).of(3, "l1_unstructured"); },
                          {"l1_unstructured", "amount=4", "parameters to prune=3"}));
  EXPECT_TRUE(throws_with([] { compress::Amount(-0.1); }, {"amount=-0.1", "[0, 1]"}));
  EXPECT_TRUE(throws_with([] { compress::Amount(1.5); }, {"amount=1.5"}));
  EXPECT_TRUE(throws_with([] { compress::Amount(-2); }, {"amount=-2", "non-negative"}));
}

TEST(Prune, ChannelNormsAndTaylorMatchLoops) {
  Generator g(1);
  const Tensor w = randn({4, 3, 2, 2}, kFloat64, &g);
  const auto v = values(w);
  for (int64_t dim : {0, 1}) {
    const int64_t channels = w.size(dim);
    std::vector<double> l1(channels, 0), l2(channels, 0), linf(channels, 0);
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t c = dim == 0 ? static_cast<int64_t>(i) / 12 : (static_cast<int64_t>(i) / 4) % 3;
      l1[c] += std::fabs(v[i]), l2[c] += v[i] * v[i], linf[c] = std::max(linf[c], std::fabs(v[i]));
    }
    for (double& x : l2) x = std::sqrt(x);
    EXPECT_TRUE(all_close(compress::channel_importance(w, compress::Importance::L1, dim), l1, 1e-12, 0));
    EXPECT_TRUE(all_close(compress::channel_importance(w, compress::Importance::L2, dim), l2, 1e-12, 0));
    EXPECT_TRUE(strata::testing::all_close(compress::channel_norms(w, INFINITY, dim), linf, 0, 0));
  }
  // Taylor: sum |w * dL/dw| per output channel, with L = sum(c * w) so dL/dw = c
  const Tensor p = strata::testing::leaf(w.clone()), c = randn({4, 3, 2, 2}, kFloat64, &g);
  EXPECT_TRUE(throws_with([&] { compress::channel_importance(p, compress::Importance::Taylor); }, {"gradient"}));
  (p * c).sum().backward();
  const auto cv = values(c);
  std::vector<double> taylor(4, 0);
  for (size_t i = 0; i < v.size(); ++i) taylor[i / 12] += std::fabs(v[i] * cv[i]);
  EXPECT_TRUE(all_close(compress::channel_importance(p, compress::Importance::Taylor), taylor, 1e-12, 0));
}

TEST(Prune, L1UnstructuredZerosTheSmallestAndKeepsAMaskBuffer) {
  Generator g(2);
  nn::Linear fc(5, 4, {.generator = &g});
  const auto before = values(fc.weight);
  compress::l1_unstructured(fc, "weight", 0.3);  // round(0.3 * 20) = 6
  EXPECT_EQ(zero_positions(fc.weight), smallest_abs(before, 6));
  ASSERT_TRUE(has_key(fc, "weight_mask"));
  const auto mask = values(fc.state_dict().at("weight_mask"));
  for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(mask[i], smallest_abs(before, 6).count(i) ? 0.0 : 1.0);
  // iterative: the next amount counts the 14 entries left, round(0.5 * 14) = 7, 13 in all
  compress::l1_unstructured(fc, "weight", 0.5);
  EXPECT_EQ(zero_positions(fc.weight), smallest_abs(before, 13));
  compress::l1_unstructured(fc, "weight", 2);  // a count
  EXPECT_EQ(zero_positions(fc.weight), smallest_abs(before, 15));
  EXPECT_TRUE(compress::is_pruned(fc));
  // kept entries keep their values exactly
  const auto after = values(fc.weight);
  for (size_t i = 0; i < after.size(); ++i)
    if (after[i] != 0) EXPECT_EQ(after[i], before[i]);
}

TEST(Prune, LnStructuredZerosWholeChannels) {
  Generator g(3);
  nn::Conv2d conv(3, 6, 2, {.generator = &g});
  const Tensor w0 = conv.weight.detach().clone();
  const auto norms = values(compress::channel_norms(w0, 2, 0));
  std::vector<int64_t> order(6);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return norms[a] < norms[b]; });
  compress::ln_structured(conv, "weight", 0.5, 2, 0);  // the 3 filters of smallest L2 norm
  const auto w = values(conv.weight), before = values(w0);
  const std::set<int64_t> gone(order.begin(), order.begin() + 3);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], gone.count(static_cast<int64_t>(i) / 12) ? 0.0 : before[i]);
  // again along the input channels (dim -3 == 1) by L1 norm, on top of the first mask
  const auto in_norms = values(compress::channel_norms(conv.weight, 1, 1));
  const int64_t dropped = std::min_element(in_norms.begin(), in_norms.end()) - in_norms.begin();
  compress::ln_structured(conv, "weight", 1, 1, -3);
  const auto w2 = values(conv.weight);
  int64_t zero_in = -1;
  for (int64_t c = 0; c < 3; ++c)
    if (values(compress::channel_norms(conv.weight, 1, 1))[c] == 0) zero_in = c;
  EXPECT_EQ(zero_in, dropped);
  for (size_t i = 0; i < w2.size(); ++i)
    if (!gone.count(static_cast<int64_t>(i) / 12) && (static_cast<int64_t>(i) / 4) % 3 != zero_in)
      EXPECT_EQ(w2[i], before[i]);
}

TEST(Prune, PrunedEntriesGetNoGradient) {
  Generator g(4);
  nn::Linear fc(4, 3, {.generator = &g});
  const Tensor x = randn({5, 4}, kFloat32, &g);
  compress::l1_unstructured(fc, "weight", 5);
  fc(x).pow(2).sum().backward();
  const auto grad = values(fc.weight.grad()), mask = values(fc.state_dict().at("weight_mask"));
  // the gradient a plain linear with the same (pruned) weight gets
  nn::Linear ref(4, 3);
  ref.load_state_dict({{"weight", fc.weight.detach().clone()}, {"bias", fc.bias.detach().clone()}});
  ref(x).pow(2).sum().backward();
  const auto want = values(ref.weight.grad());
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_EQ(grad[i], mask[i] == 0 ? 0.0 : want[i]);
}

TEST(Prune, GlobalUnstructuredPicksTheGloballySmallest) {
  Generator g(6);
  nn::Linear a(4, 4, {.generator = &g}), b(4, 3, {.generator = &g});
  {
    NoGradGuard no_grad;
    b.weight.mul_(0.2);  // b's weights are smaller: global pruning takes more of them
  }
  auto all = values(a.weight);
  const auto bv = values(b.weight);
  all.insert(all.end(), bv.begin(), bv.end());
  compress::global_unstructured({{&a}, {&b}}, 0.5);  // round(0.5 * 28) = 14
  const std::set<int64_t> want = smallest_abs(all, 14);
  std::set<int64_t> got = zero_positions(a.weight);
  for (int64_t i : zero_positions(b.weight)) got.insert(i + 16);
  EXPECT_EQ(got, want);
  EXPECT_GT(zero_positions(b.weight).size() * 16, zero_positions(a.weight).size() * 12);  // larger share of b
}

TEST(Prune, RemoveMakesItPermanent) {
  Generator g(7);
  nn::Linear fc(3, 3, {.generator = &g});
  EXPECT_TRUE(throws_with([&] { compress::remove(fc, "weight"); }, {"has to be pruned"}));
  compress::custom_from_mask(fc, "weight", from_vector<float>({1, 0, 1, 0, 1, 1, 1, 1, 0}, Shape{3, 3}));
  const std::set<int64_t> zeros = zero_positions(fc.weight);
  EXPECT_EQ(zeros, (std::set<int64_t>{1, 3, 8}));
  compress::remove(fc, "weight");
  EXPECT_FALSE(has_key(fc, "weight_mask"));
  EXPECT_FALSE(compress::is_pruned(fc));
  EXPECT_EQ(zero_positions(fc.weight), zeros);
  fc(ones({2, 3})).sum().backward();  // the gradient is no longer masked
  for (double v : values(fc.weight.grad())) EXPECT_NE(v, 0.0);
  compress::l1_unstructured(fc, "weight", 4);  // pruning again after remove
  EXPECT_EQ(zero_positions(fc.weight).size(), 4u);
}

TEST(Prune, PrunedCheckpointLoadsIntoAFreshModelAfterIdentity) {
  Generator g(8);
  nn::Linear pruned(4, 3, {.generator = &g}), fresh(4, 3, {.generator = &g});
  compress::l1_unstructured(pruned, "weight", 0.5);
  const nn::StateDict saved = pruned.state_dict();
  EXPECT_TRUE(throws_with([&] { fresh.load_state_dict(saved); }, {"weight_mask"}));  // strict: unexpected key
  compress::identity(fresh, "weight");
  EXPECT_EQ(zero_positions(fresh.weight).size(), 0u);
  fresh.load_state_dict(saved);
  EXPECT_EQ(values(fresh.weight), values(pruned.weight));
  fresh(ones({1, 4})).sum().backward();  // the loaded mask masks the gradient
  for (int64_t i : zero_positions(pruned.weight)) EXPECT_EQ(values(fresh.weight.grad())[i], 0.0);
}

TEST(Prune, MasksFollowModuleTo) {
  Generator g(9);
  nn::Linear fc(4, 3, {.generator = &g});
  compress::l1_unstructured(fc, "weight", 6);
  const std::set<int64_t> pruned = zero_positions(fc.weight);
  fc.to(kFloat64);  // converts the mask buffer in place: the gradient hook sees the new one
  EXPECT_EQ(fc.state_dict().at("weight_mask").dtype(), kFloat64);
  fc(ones({2, 4}, kFloat64)).sum().backward();
  EXPECT_EQ(fc.weight.grad().dtype(), kFloat64);
  EXPECT_EQ(zero_positions(fc.weight.grad()), pruned);
  EXPECT_TRUE(throws_with([&] { fc.remove_buffer("bias_mask"); }, {"no buffer named \"bias_mask\""}));
}

TEST(Prune, NaNScoresRankAboveEveryNumber) {
  // as torch.topk(largest=False) ranks them: the NaN weights are pruned last
  nn::Linear fc(4, 1);
  {
    NoGradGuard no_grad;
    fc.weight.copy_(from_vector<float>({NAN, 0.5f, NAN, -0.25f}, Shape{1, 4}));
  }
  compress::l1_unstructured(fc, "weight", 3);  // the two numbers, then the first NaN (ties: lower index)
  EXPECT_EQ(values(fc.state_dict().at("weight_mask")), (std::vector<double>{0, 0, 1, 0}));
}

TEST(Prune, BadInputRaises) {
  nn::Linear fc(3, 2);
  EXPECT_TRUE(throws_with([&] { compress::ln_structured(fc, "bias", 1, 2, 0); }, {"ln_structured", "at least 2 dims"}));
  EXPECT_TRUE(throws_with([&] { compress::ln_structured(fc, "weight", 1, 2, 2); }, {"dim 2 does not exist"}));
  EXPECT_TRUE(throws_with([&] { compress::ln_structured(fc, "weight", 1, 2, -3); }, {"dim -3 does not exist"}));
  EXPECT_TRUE(throws_with([&] { compress::ln_structured(fc, "weight", 3, 2, 0); }, {"amount=3"}));
  EXPECT_TRUE(throws_with([&] { compress::l1_unstructured(fc, "weight", 7); }, {"amount=7", "=6"}));
  EXPECT_TRUE(throws_with([&] { compress::l1_unstructured(fc, "kernel", 1); }, {"no parameter named \"kernel\""}));
  EXPECT_TRUE(throws_with([&] { compress::l1_unstructured(fc, "weight", 1, zeros({3})); }, {"importance scores"}));
  EXPECT_TRUE(throws_with([&] { compress::custom_from_mask(fc, "weight", ones({3, 2})); }, {"custom_from_mask"}));
  EXPECT_TRUE(throws_with([&] { compress::global_unstructured({}, 0.5); }, {"no parameters"}));
  EXPECT_TRUE(throws_with([&] { compress::global_unstructured({{&fc}, {&fc}}, 0.5); }, {"listed twice"}));
  EXPECT_TRUE(throws_with([&] { compress::channel_norms(fc.weight, -1, 0); }, {"p=-1"}));
}
