// scaled_dot_product_attention, MultiheadAttention and TransformerEncoderLayer against float64
// loop references (attention_testing.h), finite-difference gradients, PyTorch's parameter
// names and initialization, and masks of the wrong shape.
#include <cmath>

#include "nn/attention_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::attention_ref;
using strata::testing::gradcheck;
using strata::testing::kNegInf;
using strata::testing::Layout;
using strata::testing::leaf;
using strata::testing::Mat;
using strata::testing::MhaParams;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

// The (L, E) problem at batch index (a, b) of a 4-d tensor; size-1 or missing leading dims
// broadcast.
Mat problem(const Tensor& t, int64_t a, int64_t b) {
  Tensor x = t;
  while (x.dim() < 4) x = x.unsqueeze(0);
  return Mat(x.select(0, x.size(0) == 1 ? 0 : a).select(0, x.size(1) == 1 ? 0 : b));
}

// Stacks the (L, Ev) references of every (a, b) in C order.
std::vector<double> sdpa_ref(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const std::function<double(int64_t, int64_t, int64_t, int64_t)>& bias = nullptr) {
  std::vector<double> out;
  for (int64_t a = 0; a < q.size(0); ++a)
    for (int64_t b = 0; b < q.size(1); ++b) {
      strata::testing::ScoreBias sb;
      if (bias) sb = [&, a, b](int64_t i, int64_t j) { return bias(a, b, i, j); };
      Mat o = attention_ref(problem(q, a, b), problem(k, a, b), problem(v, a, b), scale, sb);
      out.insert(out.end(), o.v.begin(), o.v.end());
    }
  return out;
}

MhaParams params_of(const nn::MultiheadAttention& m) {
  MhaParams p;
  p.heads = m.num_heads;
  p.in_w = Mat(m.in_proj_weight);
  if (m.in_proj_bias.defined()) p.in_b = values(m.in_proj_bias);
  p.out_w = Mat(m.out_proj.weight);
  if (m.out_proj.bias.defined()) p.out_b = values(m.out_proj.bias);
  return p;
}

// A float64 MultiheadAttention with random (non-zero) biases.
void randomize_biases(nn::MultiheadAttention& m, Generator& g) {
  m.to(kFloat64);
  m.in_proj_bias.set_data(randn({3 * m.embed_dim}, kFloat64, &g));
  m.out_proj.bias.set_data(randn({m.embed_dim}, kFloat64, &g));
}

// Batch n of a sequence-first (L, N, E) tensor as an (L, E) matrix.
Mat item(const Tensor& x, int64_t n) { return Mat(x.select(1, n)); }

// Concatenates per-item (L, E) outputs back into (L, N, E) C order.
std::vector<double> seq_first(const std::vector<Mat>& items) {
  const int64_t L = items[0].rows, E = items[0].cols, N = static_cast<int64_t>(items.size());
  std::vector<double> out(static_cast<size_t>(L * N * E));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t e = 0; e < E; ++e) out[(i * N + n) * E + e] = items[n](i, e);
  return out;
}

}  // namespace

// ---- scaled_dot_product_attention --------------------------------------------------------------

TEST(ScaledDotProductAttention, MatchesLoopReference) {
  Generator g(1);
  Tensor q = randn({2, 3, 4, 5}, kFloat64, &g), k = randn({2, 3, 6, 5}, kFloat64, &g);
  Tensor v = randn({2, 3, 6, 7}, kFloat64, &g);
  const double s = 1 / std::sqrt(5.0);
  Tensor y = F::scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 7}));
  EXPECT_TRUE(all_close(y, sdpa_ref(q, k, v, s), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(q, k, v, Tensor(), 0, false, 0.3), sdpa_ref(q, k, v, 0.3),
                        1e-12, 1e-12));
  // key and value broadcast over the leading batch dim
  Tensor kb = randn({3, 6, 5}, kFloat64, &g), vb = randn({3, 6, 7}, kFloat64, &g);
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(q, kb, vb), sdpa_ref(q, kb, vb, s), 1e-12, 1e-12));
  // non-contiguous inputs
  Tensor qt = strata::testing::with_layout(q, Layout::Transposed), vs = strata::testing::with_layout(v, Layout::Sliced);
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(qt, k, vs), sdpa_ref(q, k, v, s), 1e-12, 1e-12));
  // float32 follows the float64 result
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32)),
                        sdpa_ref(q, k, v, s), 1e-5, 1e-5));
}

TEST(ScaledDotProductAttention, BoolFloatAndCausalMasks) {
  Generator g(2);
  Tensor q = randn({2, 2, 4, 3}, kFloat64, &g), k = randn({2, 2, 6, 3}, kFloat64, &g);
  Tensor v = randn({2, 2, 6, 2}, kFloat64, &g);
  const double s = 1 / std::sqrt(3.0);
  // bool (L, S): true where the query may attend; every query keeps key 0
  Tensor allow = rand({4, 6}, kFloat32, &g) > 0.4;
  allow.select(1, 0).fill_(true);
  std::vector<double> av = values(allow);
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(q, k, v, allow),
                        sdpa_ref(q, k, v, s, [&](int64_t, int64_t, int64_t i, int64_t j) {
                          return av[i * 6 + j] != 0 ? 0.0 : kNegInf;
                        }),
                        1e-12, 1e-12));
  // float (2, 1, L, S): added to the scores, broadcast over heads
  Tensor add = randn({2, 1, 4, 6}, kFloat64, &g);
  std::vector<double> addv = values(add);
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(q, k, v, add),
                        sdpa_ref(q, k, v, s, [&](int64_t a, int64_t, int64_t i, int64_t j) {
                          return addv[(a * 4 + i) * 6 + j];
                        }),
                        1e-12, 1e-12));
  // causal: query i sees keys j <= i (top-left aligned, as in PyTorch)
  EXPECT_TRUE(all_close(F::scaled_dot_product_attention(q, k, v, Tensor(), 0, true),
                        sdpa_ref(q, k, v, s, [](int64_t, int64_t, int64_t i, int64_t j) {
                          return j > i ? kNegInf : 0.0;
                        }),
                        1e-12, 1e-12));
  // a query with every key masked gives NaN, the others are unaffected
  Tensor none = ones({4, 6}, kBool);
  none.select(0, 2).fill_(false);
  std::vector<double> y = values(F::scaled_dot_product_attention(q, k, v, none));
  std::vector<double> want = sdpa_ref(q, k, v, s);
  for (size_t i = 0; i < y.size(); ++i) {
    const bool row2 = (i / 2) % 4 == 2;
    if (row2) EXPECT_TRUE(std::isnan(y[i])) << i;
    else EXPECT_NEAR(y[i], want[i], 1e-12) << i;
  }
}

// is_causal (a masked softmax in one kernel) against the same mask passed as a bool tensor,
// with more queries than keys and fewer, in every floating dtype; masked weights are exact
// zeros, so the two agree to rounding.
TEST(ScaledDotProductAttention, CausalMaskEveryShapeAndDtype) {
  Generator g(4);
  for (auto [L, S] : {std::pair<int64_t, int64_t>{5, 5}, {7, 3}, {3, 7}, {1, 4}, {130, 130}})
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
      Tensor q = randn({2, 3, L, 8}, kFloat64, &g).to(t), k = randn({2, 3, S, 8}, kFloat64, &g).to(t);
      Tensor v = randn({2, 3, S, 5}, kFloat64, &g).to(t);
      Tensor allow = logical_not(triu(ones({L, S}, kBool), 1));
      Tensor got = F::scaled_dot_product_attention(q, k, v, Tensor(), 0, true);
      Tensor want = F::scaled_dot_product_attention(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), allow);
      EXPECT_EQ(got.dtype(), t);
      const double tol = t == kFloat64 ? 1e-12 : t == kFloat32 ? 1e-5 : t == kFloat16 ? 5e-3 : 4e-2;
      EXPECT_TRUE(all_close(values(got), values(want), tol, tol)) << dtype_name(t) << " L " << L << " S " << S;
    }
  Tensor q = leaf(randn({1, 2, 6, 3}, kFloat64, &g)), k = leaf(randn({1, 2, 4, 3}, kFloat64, &g));
  Tensor v = leaf(randn({1, 2, 4, 2}, kFloat64, &g));
  EXPECT_TRUE(
      gradcheck([](V in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0, true); }, {q, k, v}));
}

TEST(ScaledDotProductAttention, GradCheck) {
  Generator g(3);
  Tensor q = leaf(randn({1, 2, 3, 4}, kFloat64, &g), Layout::Transposed);
  Tensor k = leaf(randn({1, 2, 5, 4}, kFloat64, &g));
  Tensor v = leaf(randn({1, 2, 5, 3}, kFloat64, &g), Layout::Sliced);
  Tensor add = randn({3, 5}, kFloat64, &g);
  Tensor allow = ones({3, 5}, kBool);
  allow.select(1, 4).fill_(false);
  EXPECT_TRUE(gradcheck([](V in) { return F::scaled_dot_product_attention(in[0], in[1], in[2]); }, {q, k, v}));
  EXPECT_TRUE(gradcheck([&](V in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], add); }, {q, k, v}));
  EXPECT_TRUE(gradcheck([&](V in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], allow); }, {q, k, v}));
  EXPECT_TRUE(gradcheck(
      [](V in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0, true, 0.7); }, {q, k, v}));
}

TEST(ScaledDotProductAttention, DropoutUsesTheGeneratorsMask) {
  Generator g(4);
  Tensor q = randn({2, 3, 4}, kFloat64, &g), k = randn({2, 5, 4}, kFloat64, &g), v = randn({2, 5, 3}, kFloat64, &g);
  Generator g1(99), g2(99);
  Tensor y = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.4, false, std::nullopt, &g1);
  // the same draw on ones gives the mask scaled by 1 / (1 - p): y = (softmax * mask) @ v
  Tensor mask = F::dropout(ones({2, 3, 5}, kFloat64), 0.4, true, &g2);
  Tensor w = softmax(matmul(q, k.transpose(-2, -1)) / 2.0, -1);
  Tensor want = matmul(w * mask, v);
  EXPECT_TRUE(all_close(y, values(want), 1e-12, 1e-12));
  EXPECT_FALSE(all_close(y, values(matmul(w, v)), 1e-6, 1e-6));
  for (double x : values(F::scaled_dot_product_attention(q, k, v, Tensor(), 1.0))) EXPECT_EQ(x, 0.0);
}

TEST(ScaledDotProductAttention, BadInputRaises) {
  Tensor q = randn({2, 4, 8}), k = randn({2, 6, 8}), v = randn({2, 6, 3});
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, v, ones({4, 5}, kBool)); },
                          {"[scaled_dot_product_attention]", "attn_mask", "[4, 5]", "[2, 4, 6]"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, v, zeros({3, 4, 6})); }, {"attn_mask"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, v, ones({4, 6}, kBool), 0, true); },
                          {"either attn_mask or is_causal"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, randn({2, 6, 7}), v); }, {"embedding"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, randn({2, 5, 3})); }, {"sequence"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(randn({8}), k, v); }, {"(..., L, E)"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q.to(kInt32), k, v); }, {"floating"}));
  // one dtype for the three, as PyTorch: no silent promotion to the wider one
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k.to(kFloat64), v); },
                          {"one dtype", "float32, float64 and float32"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, v.to(kFloat16)); }, {"one dtype"}));
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, v, Tensor(), 1.5); }, {"dropout_p"}));
  // 0/1 integer masks are neither PyTorch's bool convention nor an additive float mask
  for (DType t : {kInt64, kInt32, kUInt8})
    EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(q, k, v, ones({4, 6}, t)); }, {"attn_mask", "bool"}));
  // batch dims that do not broadcast are named as attention's, not a product's
  EXPECT_TRUE(throws_with([&] { F::scaled_dot_product_attention(randn({3, 4, 8}), k, randn({2, 6, 3})); },
                          {"[scaled_dot_product_attention]", "batch dims", "[3, 4, 8]"}));
}

// ---- MultiheadAttention ------------------------------------------------------------------------

TEST(MultiheadAttention, ParametersAndInitFollowPyTorch) {
  Generator g(5);
  nn::MultiheadAttention mha(64, 4, {.generator = &g});
  std::vector<std::string> names;
  for (auto& [n, p] : mha.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(mha.in_proj_weight.shape(), (Shape{192, 64}));
  EXPECT_EQ(mha.head_dim, 16);
  // in_proj_weight: xavier_uniform over (3E, E), bound sqrt(6 / (E + 3E)); std bound / sqrt(3)
  const double bound = std::sqrt(6.0 / 256.0);
  std::vector<double> w = values(mha.in_proj_weight);
  double mx = 0, sq = 0;
  for (double x : w) mx = std::max(mx, std::fabs(x)), sq += x * x;
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.99 * bound);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(w.size())), bound / std::sqrt(3.0), 0.02 * bound);
  for (double x : values(mha.in_proj_bias)) EXPECT_EQ(x, 0.0);
  for (double x : values(mha.out_proj.bias)) EXPECT_EQ(x, 0.0);
  // out_proj keeps Linear's default, U(+-1/sqrt(E))
  for (double x : values(mha.out_proj.weight)) EXPECT_LE(std::fabs(x), 1.0 / 8.0);
  nn::MultiheadAttention nb(8, 2, {.bias = false});
  EXPECT_EQ(nb.named_parameters().size(), 2u);
  EXPECT_TRUE(throws_with([] { nn::MultiheadAttention(6, 4); }, {"MultiheadAttention", "divisible"}));
  EXPECT_TRUE(throws_with([] { nn::MultiheadAttention(0, 1); }, {"positive"}));
}

TEST(MultiheadAttention, SelfAttentionWithMasksMatchesReference) {
  Generator g(6);
  const int64_t L = 4, N = 2, E = 6, H = 2;
  nn::MultiheadAttention mha(E, H, {.generator = &g});
  randomize_biases(mha, g);
  MhaParams p = params_of(mha);
  Tensor x = randn({L, N, E}, kFloat64, &g);
  auto ref = [&](const std::function<double(int64_t, int64_t, int64_t, int64_t)>& bias) {
    std::vector<Mat> out;
    for (int64_t n = 0; n < N; ++n) {
      std::function<double(int64_t, int64_t, int64_t)> b;
      if (bias) b = [&, n](int64_t h, int64_t i, int64_t j) { return bias(n, h, i, j); };
      out.push_back(strata::testing::mha_ref(p, item(x, n), item(x, n), item(x, n), b));
    }
    return seq_first(out);
  };
  Tensor y = mha(x);
  EXPECT_EQ(y.shape(), (Shape{L, N, E}));
  EXPECT_TRUE(all_close(y, ref(nullptr), 1e-12, 1e-12));

  // key_padding_mask (N, S), true = ignore: the second sequence has two padded keys
  Tensor pad = zeros({N, L}, kBool);
  pad.select(0, 1).narrow(0, 2, 2).fill_(true);
  auto padded = [](int64_t n, int64_t j) { return n == 1 && j >= 2; };
  EXPECT_TRUE(all_close(mha.forward(x, x, x, pad), ref([&](int64_t n, int64_t, int64_t, int64_t j) {
                          return padded(n, j) ? kNegInf : 0.0;
                        }),
                        1e-12, 1e-12));
  // plus a float attn_mask (L, S) and the causal mask
  Tensor am = randn({L, L}, kFloat64, &g);
  Mat amm(am);
  EXPECT_TRUE(all_close(mha.forward(x, x, x, pad, am, true), ref([&](int64_t n, int64_t, int64_t i, int64_t j) {
                          return padded(n, j) || j > i ? kNegInf : amm(i, j);
                        }),
                        1e-12, 1e-12));
  // a bool (N * H, L, S) mask, true = blocked, ordered batch-major (n * H + h) as in PyTorch
  Tensor blk = rand({N * H, L, L}, kFloat32, &g) > 0.5;
  for (int64_t i = 0; i < L; ++i) blk.select(1, i).select(1, i).fill_(false);  // the diagonal stays open
  std::vector<double> bv = values(blk);
  EXPECT_TRUE(all_close(mha.forward(x, x, x, Tensor(), blk), ref([&](int64_t n, int64_t h, int64_t i, int64_t j) {
                          return bv[((n * H + h) * L + i) * L + j] != 0 ? kNegInf : 0.0;
                        }),
                        1e-12, 1e-12));
  // a float key_padding_mask is added
  Tensor fpad = randn({N, L}, kFloat64, &g);
  Mat fp(fpad);
  EXPECT_TRUE(all_close(mha.forward(x, x, x, fpad), ref([&](int64_t n, int64_t, int64_t, int64_t j) {
                          return fp(n, j);
                        }),
                        1e-12, 1e-12));
}

TEST(MultiheadAttention, CrossAttentionBatchFirstAndUnbatched) {
  Generator g(7);
  const int64_t L = 3, S = 5, N = 2, E = 8, H = 4;
  nn::MultiheadAttention mha(E, H, {.generator = &g});
  randomize_biases(mha, g);
  MhaParams p = params_of(mha);
  Tensor q = randn({L, N, E}, kFloat64, &g), k = randn({S, N, E}, kFloat64, &g), v = randn({S, N, E}, kFloat64, &g);
  std::vector<Mat> distinct, kv;
  for (int64_t n = 0; n < N; ++n) {
    distinct.push_back(strata::testing::mha_ref(p, item(q, n), item(k, n), item(v, n)));
    kv.push_back(strata::testing::mha_ref(p, item(q, n), item(k, n), item(k, n)));
  }
  Tensor y = mha.forward(q, k, v);
  EXPECT_EQ(y.shape(), (Shape{L, N, E}));
  EXPECT_TRUE(all_close(y, seq_first(distinct), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(mha.forward(q, k, k), seq_first(kv), 1e-12, 1e-12));  // key is value: one fused GEMM

  // batch_first with the same weights (loaded through the state dict) gives the transposed result
  nn::MultiheadAttention bf(E, H, {.batch_first = true});
  bf.to(kFloat64);
  bf.load_state_dict(mha.state_dict());
  Tensor ybf = bf.forward(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1));
  EXPECT_EQ(ybf.shape(), (Shape{N, L, E}));
  EXPECT_TRUE(all_close(ybf.transpose(0, 1), seq_first(distinct), 1e-12, 1e-12));

  // unbatched (L, E) with a (S) padding mask
  Tensor pad = from_vector<bool>({false, true, false, false, true});
  Tensor yu = mha.forward(q.select(1, 1), k.select(1, 1), v.select(1, 1), pad);
  EXPECT_EQ(yu.shape(), (Shape{L, E}));
  Mat want = strata::testing::mha_ref(p, item(q, 1), item(k, 1), item(v, 1), [](int64_t, int64_t, int64_t j) {
    return j == 1 || j == 4 ? kNegInf : 0.0;
  });
  EXPECT_TRUE(all_close(yu, want.v, 1e-12, 1e-12));
}

// kdim and vdim other than embed_dim: separate q/k/v weights, named and shaped as PyTorch's.
TEST(MultiheadAttention, KeyAndValueFeaturesOfTheirOwn) {
  Generator g(11);
  const int64_t L = 3, S = 4, N = 2, E = 8, H = 2, KD = 5, VD = 7;
  nn::MultiheadAttention mha(E, H, {.generator = &g, .kdim = KD, .vdim = VD});
  std::vector<std::string> names;
  for (auto& [n, p] : mha.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                             "out_proj.weight", "out_proj.bias"}));
  EXPECT_FALSE(mha.in_proj_weight.defined());
  EXPECT_EQ(mha.k_proj_weight.shape(), (Shape{E, KD}));
  EXPECT_EQ(mha.v_proj_weight.shape(), (Shape{E, VD}));
  // xavier_uniform of each: bound sqrt(6 / (E + kdim))
  for (double x : values(mha.k_proj_weight)) EXPECT_LE(std::fabs(x), std::sqrt(6.0 / (E + KD)));
  randomize_biases(mha, g);
  MhaParams p;
  p.heads = H;
  p.q_w = Mat(mha.q_proj_weight), p.k_w = Mat(mha.k_proj_weight), p.v_w = Mat(mha.v_proj_weight);
  p.in_b = values(mha.in_proj_bias);
  p.out_w = Mat(mha.out_proj.weight);
  p.out_b = values(mha.out_proj.bias);
  Tensor q = randn({L, N, E}, kFloat64, &g), k = randn({S, N, KD}, kFloat64, &g), v = randn({S, N, VD}, kFloat64, &g);
  std::vector<Mat> want;
  for (int64_t n = 0; n < N; ++n) want.push_back(strata::testing::mha_ref(p, item(q, n), item(k, n), item(v, n)));
  Tensor y = mha.forward(q, k, v);
  EXPECT_EQ(y.shape(), (Shape{L, N, E}));
  EXPECT_TRUE(all_close(y, seq_first(want), 1e-12, 1e-12));
  Tensor kl = leaf(k), vl = leaf(v);
  EXPECT_TRUE(gradcheck([&](V in) { return mha.forward(q, in[0], in[1]); },
                        {kl, vl, mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight}));
  EXPECT_TRUE(throws_with([&] { mha.forward(q, v, v); }, {"key", "kdim 5"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(q, k, k); }, {"value", "vdim 7"}));
  EXPECT_TRUE(throws_with([] { nn::MultiheadAttention(8, 2, {.kdim = -1}); }, {"kdim", "negative"}));
}

// The weights PyTorch's need_weights=True returns, per head and averaged, against the softmax
// of the reference scores; the output is forward's.
// add_bias_kv and add_zero_attn: a learned key and value, then a zero one, after the S keys;
// masks (and is_causal) leave them open to every query, as PyTorch pads its masks.
TEST(MultiheadAttention, BiasKvAndZeroAttn) {
  Generator g(10);
  const int64_t L = 3, S = 4, N = 2, E = 6, H = 2;
  nn::MultiheadAttention mha(E, H, {.generator = &g, .add_bias_kv = true, .add_zero_attn = true});
  std::vector<std::string> names;
  for (auto& [n, t] : mha.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj.weight",
                                             "out_proj.bias"}));
  EXPECT_EQ(mha.bias_k.shape(), (Shape{1, 1, E}));
  randomize_biases(mha, g);
  MhaParams p = params_of(mha);
  p.bias_k = values(mha.bias_k);
  p.bias_v = values(mha.bias_v);
  p.zero_attn = true;
  Tensor q = randn({L, N, E}, kFloat64, &g), k = randn({S, N, E}, kFloat64, &g), v = randn({S, N, E}, kFloat64, &g);
  Tensor pad = zeros({N, S}, kBool);
  pad.select(0, 1).narrow(0, 1, 3).fill_(true);
  Tensor am = randn({L, S}, kFloat64, &g);
  Mat amm(am);
  auto ref = [&](const Tensor& kk, const Tensor& vv, bool masked, bool causal) {
    std::vector<Mat> out;
    for (int64_t n = 0; n < N; ++n)
      out.push_back(strata::testing::mha_ref(p, item(q, n), item(kk, n), item(vv, n), [&, n](int64_t, int64_t i,
                                                                                             int64_t j) {
        if (j >= kk.size(0)) return 0.0;  // an appended key
        if (causal && j > i) return kNegInf;
        if (!masked) return 0.0;
        return n == 1 && j >= 1 ? kNegInf : amm(i, j);
      }));
    return seq_first(out);
  };
  EXPECT_TRUE(all_close(mha.forward(q, k, v), ref(k, v, false, false), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(mha.forward(q, k, v, pad, am), ref(k, v, true, false), 1e-12, 1e-12));
  Tensor k3 = k.narrow(0, 0, L), v3 = v.narrow(0, 0, L);
  EXPECT_TRUE(all_close(mha.forward(q, k3, v3, Tensor(), Tensor(), true), ref(k3, v3, false, true), 1e-12, 1e-12));
  Tensor weights = mha.forward_with_weights(q, k, v, pad).weights;
  EXPECT_EQ(weights.shape(), (Shape{N, L, S + 2}));
  // batch first, and each option alone
  nn::MultiheadAttention first(E, H, {.batch_first = true, .generator = &g, .add_bias_kv = true});
  first.to(kFloat64);
  nn::MultiheadAttention seq(E, H, {.generator = &g, .add_bias_kv = true});
  seq.to(kFloat64);
  seq.load_state_dict(first.state_dict());
  EXPECT_TRUE(all_close(first.forward(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1),
                        values(seq.forward(q, k, v)), 1e-12, 1e-12));
  nn::MultiheadAttention zero_only(E, H, {.generator = &g, .add_zero_attn = true});
  zero_only.to(kFloat64);
  MhaParams pz = params_of(zero_only);
  pz.zero_attn = true;
  EXPECT_TRUE(all_close(zero_only.forward(q.select(1, 0), k.select(1, 0), v.select(1, 0)),
                        strata::testing::mha_ref(pz, item(q, 0), item(k, 0), item(v, 0)).v, 1e-12, 1e-12));
  // gradients reach bias_k and bias_v
  Tensor x = leaf(randn({3, 2, E}, kFloat64, &g));
  EXPECT_TRUE(gradcheck([&](V in) { return mha.forward(in[0], in[0], in[0], Tensor(), Tensor(), true); },
                        {x, mha.bias_k, mha.bias_v}));
  // xavier_normal_ of (1, 1, E): fan_in = fan_out = E, std sqrt(1 / E)
  nn::MultiheadAttention wide(1024, 8, {.generator = &g, .add_bias_kv = true});
  std::vector<double> bk = values(wide.bias_k);
  double sq = 0;
  for (double b : bk) sq += b * b;
  EXPECT_NEAR(std::sqrt(sq / 1024.0), std::sqrt(1.0 / 1024.0), 0.1 * std::sqrt(1.0 / 1024.0));
}

TEST(MultiheadAttention, ForwardWithWeights) {
  Generator g(12);
  const int64_t L = 3, S = 4, N = 2, E = 6, H = 3, hd = E / H;
  nn::MultiheadAttention mha(E, H, {.generator = &g});
  randomize_biases(mha, g);
  MhaParams p = params_of(mha);
  Tensor q = randn({L, N, E}, kFloat64, &g), kv = randn({S, N, E}, kFloat64, &g);
  Tensor pad = zeros({N, S}, kBool);
  pad.select(0, 1).select(0, 2).fill_(true);  // sequence 1 ignores key 2
  auto [out, per_head] = mha.forward_with_weights(q, kv, kv, pad, Tensor(), false, false);
  EXPECT_TRUE(all_close(out, values(mha.forward(q, kv, kv, pad)), 1e-12, 1e-12));
  ASSERT_EQ(per_head.shape(), (Shape{N, H, L, S}));
  std::vector<double> want, mean_want(static_cast<size_t>(N * L * S), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const Mat qp = strata::testing::mha_project(p, item(q, n), 0), kp = strata::testing::mha_project(p, item(kv, n), 1);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(S));
        double mx = kNegInf, z = 0;
        for (int64_t j = 0; j < S; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c) d += qp(i, h * hd + c) * kp(j, h * hd + c);
          s[j] = n == 1 && j == 2 ? kNegInf : d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int64_t j = 0; j < S; ++j) {
          want.push_back(s[j] / z);
          mean_want[static_cast<size_t>((n * L + i) * S + j)] += s[j] / z / H;
        }
      }
  }
  EXPECT_TRUE(all_close(per_head, want, 1e-12, 1e-12));
  Tensor averaged = mha.forward_with_weights(q, kv, kv, pad).weights;
  ASSERT_EQ(averaged.shape(), (Shape{N, L, S}));
  EXPECT_TRUE(all_close(averaged, mean_want, 1e-12, 1e-12));
  // unbatched: (L, S)
  Tensor w1 = mha.forward_with_weights(q.select(1, 0), kv.select(1, 0), kv.select(1, 0)).weights;
  ASSERT_EQ(w1.shape(), (Shape{L, S}));
  EXPECT_TRUE(all_close(w1, std::vector<double>(mean_want.begin(), mean_want.begin() + L * S), 1e-12, 1e-12));
}

TEST(MultiheadAttention, GradCheckThroughInputsAndParameters) {
  Generator g(8);
  nn::MultiheadAttention mha(4, 2, {.generator = &g});
  randomize_biases(mha, g);
  Tensor x = leaf(randn({3, 2, 4}, kFloat64, &g), Layout::Transposed);
  Tensor pad = zeros({2, 3}, kBool);
  pad.select(0, 0).select(0, 2).fill_(true);
  Tensor am = randn({3, 3}, kFloat64, &g);
  EXPECT_TRUE(gradcheck([&](V in) { return mha.forward(in[0], in[0], in[0], pad, am); },
                        {x, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias}));
  Tensor k = leaf(randn({2, 2, 4}, kFloat64, &g)), v = leaf(randn({2, 2, 4}, kFloat64, &g));
  EXPECT_TRUE(gradcheck([&](V in) { return mha.forward(in[0], in[1], in[2]); }, {x, k, v, mha.in_proj_weight}));
}

TEST(MultiheadAttention, DropoutOnlyInTraining) {
  Generator g(9);
  nn::MultiheadAttention mha(8, 2, {.dropout = 0.5, .generator = &g});
  mha.to(kFloat64);
  Tensor x = randn({5, 3, 8}, kFloat64, &g);
  mha.eval();
  Tensor e1 = mha(x), e2 = mha(x);
  EXPECT_TRUE(equal(e1, e2));
  std::vector<Mat> want;
  for (int64_t n = 0; n < 3; ++n) want.push_back(strata::testing::mha_ref(params_of(mha), item(x, n), item(x, n), item(x, n)));
  EXPECT_TRUE(all_close(e1, seq_first(want), 1e-12, 1e-12));
  mha.train();
  EXPECT_FALSE(all_close(mha(x), values(e1), 1e-6, 1e-6));
}

TEST(MultiheadAttention, BadInputRaises) {
  nn::MultiheadAttention mha(8, 2);
  Tensor x = randn({4, 3, 8});
  EXPECT_TRUE(throws_with([&] { mha.forward(x, x, x, zeros({3, 5}, kBool)); },
                          {"MultiheadAttention(embed_dim=8, num_heads=2)", "key_padding_mask", "[3, 5]", "[3, 4]"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, x, x, zeros({4, 3}, kBool)); }, {"key_padding_mask"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, x, x, Tensor(), zeros({4, 5}, kBool)); }, {"attn_mask", "[4, 5]"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, x, x, Tensor(), zeros({3, 4, 4}, kBool)); }, {"attn_mask", "(6, 4, 4)"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, x, x, Tensor(), zeros({1, 4, 4, 4})); }, {"attn_mask"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, x, x, zeros({3, 4}, kInt64)); }, {"bool or floating"}));
  EXPECT_TRUE(throws_with([&] { mha(randn({4, 3, 6})); }, {"embed_dim 8", "[4, 3, 6]"}));
  EXPECT_TRUE(throws_with([&] { mha(randn({2, 4, 3, 8})); }, {"(L, N, E)", "[2, 4, 3, 8]"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, randn({4, 2, 8}), randn({4, 2, 8})); }, {"batch size"}));
  EXPECT_TRUE(throws_with([&] { mha.forward(x, randn({5, 3, 8}), randn({6, 3, 8})); }, {"key/value length"}));
}

// ---- TransformerEncoderLayer -------------------------------------------------------------------

namespace {

// One sequence (S, E) through the layer, from the layer's own parameters in float64.
Mat encoder_ref(nn::TransformerEncoderLayer& layer, const Mat& x, const std::function<double(int64_t, int64_t)>& mask) {
  using strata::testing::add;
  using strata::testing::layer_norm_ref;
  using strata::testing::linear_ref;
  MhaParams p = params_of(layer.self_attn);
  const double eps = layer.options.layer_norm_eps;
  auto norm1 = [&](const Mat& m) { return layer_norm_ref(m, values(layer.norm1.weight), values(layer.norm1.bias), eps); };
  auto norm2 = [&](const Mat& m) { return layer_norm_ref(m, values(layer.norm2.weight), values(layer.norm2.bias), eps); };
  auto sa = [&](const Mat& m) {
    return strata::testing::mha_ref(p, m, m, m, [&](int64_t, int64_t i, int64_t j) { return mask(i, j); });
  };
  auto ff = [&](const Mat& m) {
    Mat h = linear_ref(m, Mat(layer.linear1.weight), values(layer.linear1.bias));
    for (double& v : h.v)
      v = layer.options.activation == "gelu" ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))) : std::max(v, 0.0);
    return linear_ref(h, Mat(layer.linear2.weight), values(layer.linear2.bias));
  };
  if (layer.options.norm_first) {
    Mat h = add(x, sa(norm1(x)));
    return add(h, ff(norm2(h)));
  }
  Mat h = norm1(add(x, sa(x)));
  return norm2(add(h, ff(h)));
}

}  // namespace

TEST(TransformerEncoderLayer, NamesMatchPyTorch) {
  nn::TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 32});
  std::vector<std::string> names;
  for (auto& [n, p] : layer.named_parameters()) names.push_back(n);
  // torch.nn.TransformerEncoderLayer(16, 4, 32).named_parameters(), in order
  EXPECT_EQ(names, (std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                             "self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear1.weight",
                                             "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight",
                                             "norm1.bias", "norm2.weight", "norm2.bias"}));
  EXPECT_EQ(layer.linear1.weight.shape(), (Shape{32, 16}));
  EXPECT_EQ(layer.state_dict().size(), 12u);
  EXPECT_TRUE(throws_with([] { nn::TransformerEncoderLayer(16, 4, {.activation = "tanh"}); }, {"activation"}));
  EXPECT_TRUE(throws_with([] { nn::TransformerEncoderLayer(16, 3); }, {"divisible"}));
}

TEST(TransformerEncoderLayer, PostAndPreNormMatchReference) {
  const int64_t S = 5, N = 2, E = 8;
  for (bool norm_first : {false, true})
    for (const char* act : {"relu", "gelu"}) {
      SCOPED_TRACE(std::string(norm_first ? "pre-norm " : "post-norm ") + act);
      Generator g(10);
      nn::TransformerEncoderLayer layer(E, 2, {.dim_feedforward = 12, .activation = act, .norm_first = norm_first,
                                               .generator = &g});
      layer.to(kFloat64);
      randomize_biases(layer.self_attn, g);
      for (nn::LayerNorm* ln : {&layer.norm1, &layer.norm2}) {
        ln->weight.set_data(randn({E}, kFloat64, &g));
        ln->bias.set_data(randn({E}, kFloat64, &g));
      }
      layer.eval();  // dropout 0.1 by default: off in eval
      Tensor x = randn({S, N, E}, kFloat64, &g);
      Tensor pad = zeros({N, S}, kBool);
      pad.select(0, 0).select(0, 4).fill_(true);
      std::vector<Mat> plain, masked;
      for (int64_t n = 0; n < N; ++n) {
        plain.push_back(encoder_ref(layer, item(x, n), [](int64_t, int64_t) { return 0.0; }));
        masked.push_back(encoder_ref(layer, item(x, n), [n](int64_t i, int64_t j) {
          return (n == 0 && j == 4) || j > i ? kNegInf : 0.0;
        }));
      }
      EXPECT_TRUE(all_close(layer(x), seq_first(plain), 1e-10, 1e-10));
      EXPECT_TRUE(all_close(layer.forward(x, Tensor(), pad, true), seq_first(masked), 1e-10, 1e-10));
    }
}

TEST(TransformerEncoderLayer, GradCheckAndDropoutInTraining) {
  Generator g(11);
  nn::TransformerEncoderLayer layer(4, 2, {.dim_feedforward = 6, .dropout = 0.0, .activation = "gelu", .generator = &g});
  layer.to(kFloat64);
  Tensor x = leaf(randn({3, 2, 4}, kFloat64, &g));
  EXPECT_TRUE(gradcheck([&](V in) { return layer.forward(in[0], Tensor(), Tensor(), true); },
                        {x, layer.linear1.weight, layer.norm1.weight, layer.self_attn.in_proj_weight}));
  // batch_first takes (N, S, E)
  nn::TransformerEncoderLayer bf(4, 2, {.dim_feedforward = 6, .dropout = 0.0, .activation = "gelu", .batch_first = true});
  bf.to(kFloat64);
  bf.load_state_dict(layer.state_dict());
  EXPECT_TRUE(all_close(bf(x.detach().transpose(0, 1)).transpose(0, 1), values(layer(x)), 1e-12, 1e-12));
  // with dropout, training draws masks and eval does not
  nn::TransformerEncoderLayer drop(4, 2, {.dim_feedforward = 6, .dropout = 0.5});
  drop.to(kFloat64);
  drop.eval();
  Tensor e = drop(x);
  EXPECT_TRUE(equal(e, drop(x)));
  drop.train();
  EXPECT_FALSE(all_close(drop(x), values(e), 1e-6, 1e-6));
  // the layer's generator draws every dropout mask, the attention weights' included: reseeding
  // it alone repeats the output
  Generator dg(5);
  nn::TransformerEncoderLayer seeded(4, 2, {.dim_feedforward = 6, .dropout = 0.5, .generator = &dg});
  seeded.to(kFloat64);
  dg.manual_seed(7);
  Tensor first = seeded(x);
  (void)randn({16});  // advances the default generator only
  dg.manual_seed(7);
  EXPECT_TRUE(equal(seeded(x), first));
}
