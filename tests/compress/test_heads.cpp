// Attention-head pruning: head scores against out_proj's column norms summed here, and the
// masked attention against multi-head attention written out in float64 loops over the kept
// heads only.
#include <cmath>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

// Self-attention of x (L, N, E) (batch second) with the given weights, summing only the heads
// in `keep` into the output projection.
std::vector<double> attention_over(const Tensor& x, const nn::MultiheadAttention& a, const std::vector<int64_t>& keep) {
  const int64_t L = x.size(0), N = x.size(1), E = x.size(2), hd = a.head_dim;
  const auto xv = values(x), w = values(a.in_proj_weight), b = values(a.in_proj_bias);
  const auto wo = values(a.out_proj.weight), bo = values(a.out_proj.bias);
  auto proj = [&](int64_t part, int64_t l, int64_t n, int64_t row) {  // q/k/v feature `row`
    double acc = b[part * E + row];
    for (int64_t e = 0; e < E; ++e) acc += w[(part * E + row) * E + e] * xv[(l * N + n) * E + e];
    return acc;
  };
  std::vector<double> out(static_cast<size_t>(L * N * E));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> concat(static_cast<size_t>(E), 0.0);
      for (int64_t h : keep) {
        std::vector<double> p(static_cast<size_t>(L));
        double total = 0;
        for (int64_t m = 0; m < L; ++m) {
          double s = 0;
          for (int64_t d = 0; d < hd; ++d) s += proj(0, l, n, h * hd + d) * proj(1, m, n, h * hd + d);
          total += p[m] = std::exp(s / std::sqrt(static_cast<double>(hd)));
        }
        for (int64_t d = 0; d < hd; ++d)
          for (int64_t m = 0; m < L; ++m) concat[h * hd + d] += p[m] / total * proj(2, m, n, h * hd + d);
      }
      for (int64_t o = 0; o < E; ++o) {
        double acc = bo[o];
        for (int64_t c = 0; c < E; ++c) acc += wo[o * E + c] * concat[c];
        out[(l * N + n) * E + o] = acc;
      }
    }
  return out;
}

}  // namespace

TEST(Heads, ImportanceSumsTheOutProjectionColumnsOfEachHead) {
  Generator g(20);
  nn::MultiheadAttention attn(8, 4, {.generator = &g});
  const auto wo = values(attn.out_proj.weight);
  std::vector<double> l1(4, 0), l2(4, 0);
  for (int64_t o = 0; o < 8; ++o)
    for (int64_t c = 0; c < 8; ++c) l1[c / 2] += std::fabs(wo[o * 8 + c]), l2[c / 2] += wo[o * 8 + c] * wo[o * 8 + c];
  for (double& v : l2) v = std::sqrt(v);
  EXPECT_TRUE(all_close(compress::head_importance(attn), l1, 1e-12, 0));
  EXPECT_TRUE(all_close(compress::head_importance(attn, compress::Importance::L2), l2, 1e-12, 0));
  EXPECT_TRUE(throws_with([&] { compress::head_importance(attn, compress::Importance::Taylor); }, {"gradient"}));
}

TEST(Heads, MaskedHeadsContributeNothing) {
  Generator g(21);
  nn::MultiheadAttention attn(8, 4, {.generator = &g});
  attn.to(kFloat64);
  const Tensor x = randn({3, 2, 8}, kFloat64, &g);
  const auto scores = values(compress::head_importance(attn));
  const nn::StateDict original = attn.state_dict();
  std::vector<int64_t> want_keep;
  for (int64_t h = 0; h < 4; ++h) {  // the two heads of largest score, computed here
    int64_t larger = 0;
    for (double s : scores) larger += s > scores[h];
    if (larger < 2) want_keep.push_back(h);
  }
  nn::MultiheadAttention reference(8, 4);
  reference.to(kFloat64);
  reference.load_state_dict(original);
  const auto keep = compress::prune_heads(attn, 0.5);
  EXPECT_EQ(keep, want_keep);
  EXPECT_TRUE(all_close(attn(x), attention_over(x, reference, keep), 1e-10, 1e-10));
  EXPECT_TRUE(all_close(reference(x), attention_over(x, reference, {0, 1, 2, 3}), 1e-10, 1e-10));
  // pruning again counts the two heads left: one more goes, never an already masked one
  const auto again = compress::prune_heads(attn, 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0] == keep[0] || again[0] == keep[1]);
  EXPECT_TRUE(all_close(attn(x), attention_over(x, reference, again), 1e-10, 1e-10));
  EXPECT_TRUE(throws_with([&] { compress::prune_heads(attn, 1); }, {"nothing to compute"}));
  EXPECT_TRUE(throws_with([&] { compress::mask_heads(attn, {4}); }, {"head 4 is out of range"}));
  EXPECT_TRUE(throws_with([&] { compress::mask_heads(attn, {}); }, {"keep at least one"}));
}
