// Row-wise quantized embeddings: the codes and qparams against the float-qparams formula written
// out in float64, each row within half its step of the float weight, the lookups and every bag
// reduction equal to float64 reductions of the dequantized table, quantize_dynamic over a module
// tree with its state dict, and bad input.
#include <algorithm>
#include <cmath>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
namespace F = strata::nn::functional;
using st::testing::throws_with;
using st::testing::values;

namespace {

// A table with a large-range row, a constant row, a zero row and an outlier in one row.
st::Tensor table(int64_t num, int64_t dim) {
  st::Tensor w = st::randn({num, dim});
  st::NoGradGuard no_grad;
  w.select(0, 1).mul_(40.0);
  w.select(0, 2).fill_(0.75);
  w.select(0, 3).zero_();
  w.select(0, 4).select(0, dim / 2).fill_(25.0);
  return w;
}

int code_at(const std::vector<double>& codes, int64_t row, int64_t k, int64_t dim, int bits) {
  const int64_t bytes = bits == 8 ? dim : (dim + 1) / 2;
  const int byte = static_cast<int>(codes[static_cast<size_t>(row * bytes + (bits == 8 ? k : k / 2))]);
  return bits == 8 ? byte : (k % 2 ? byte >> 4 : byte & 15);
}

// The reduction of the float64 rows of `deq` (num, dim) picked by each bag, as torch's embedding_bag.
std::vector<double> bag_reference(const std::vector<double>& deq, int64_t dim, const std::vector<int64_t>& ids,
                                  const std::vector<int64_t>& starts, const std::vector<double>& weights,
                                  st::nn::EmbeddingBagMode mode, int64_t padding) {
  std::vector<double> out;
  for (size_t b = 0; b + 1 < starts.size(); ++b) {
    for (int64_t k = 0; k < dim; ++k) {
      double acc = 0;
      int64_t kept = 0;
      for (int64_t i = starts[b]; i < starts[b + 1]; ++i) {
        const int64_t id = ids[static_cast<size_t>(i)];
        if (id == padding) continue;
        const double v = deq[static_cast<size_t>(id * dim + k)];
        if (mode == st::nn::EmbeddingBagMode::Max) {
          acc = kept == 0 ? v : std::max(acc, v);
        } else {
          acc += (weights.empty() ? 1.0 : weights[static_cast<size_t>(i)]) * v;
        }
        ++kept;
      }
      if (mode == st::nn::EmbeddingBagMode::Mean && kept > 0) acc /= static_cast<double>(kept);
      out.push_back(static_cast<float>(acc));  // the float32 rounding of the float64 reduction
    }
  }
  return out;
}

}  // namespace

TEST(QuantEmbedding, RowsWithinHalfAStepOfTheFloatWeight) {
  st::manual_seed(31);
  for (int bits : {8, 4}) {
    for (int64_t dim : {int64_t{13}, int64_t{16}}) {
      const int64_t num = 9;
      const st::Tensor w = table(num, dim);
      const q::RowwiseWeight qw = q::quantize_embedding_weight(w, bits);
      ASSERT_EQ(qw.codes.shape(), (st::Shape{num, bits == 8 ? dim : (dim + 1) / 2}));
      const std::vector<double> wv = values(w), codes = values(qw.codes), scale = values(qw.scale),
                                bias = values(qw.bias), deq = values(q::dequantize_embedding_weight(qw));
      const double qmax = bits == 8 ? 255 : 15;
      for (int64_t r = 0; r < num; ++r) {
        const auto row = wv.begin() + r * dim;
        const double lo = *std::min_element(row, row + dim), hi = *std::max_element(row, row + dim);
        const double want_scale = (hi - lo) / qmax > 1.1920928955078125e-07 ? (hi - lo) / qmax : 1.0;
        EXPECT_NEAR(scale[r], want_scale, 1e-6 * want_scale) << "row " << r;
        EXPECT_NEAR(bias[r], lo, 1e-6 * std::max(1.0, std::fabs(lo))) << "row " << r;  // -zero_point * scale
        for (int64_t k = 0; k < dim; ++k) {
          const int code = code_at(codes, r, k, dim, bits);
          ASSERT_LE(code, qmax);
          const double x = wv[static_cast<size_t>(r * dim + k)], d = deq[static_cast<size_t>(r * dim + k)];
          // the code nearest the value (a tie may go either way through float32 rounding)
          EXPECT_LE(std::fabs((x - lo) / want_scale - code), 0.5 + 1e-4) << "row " << r << " col " << k;
          // float32 arithmetic: two roundings, each within an ulp of the larger term
          EXPECT_NEAR(d, scale[r] * code + bias[r], 2.5e-7 * (scale[r] * code + std::fabs(bias[r]))) << r << "," << k;
          EXPECT_LE(std::fabs(d - x), want_scale / 2 * (1 + 1e-4) + 1e-6 * std::fabs(x)) << r << "," << k;
        }
        if (bits == 4 && dim % 2) EXPECT_EQ(static_cast<int>(codes[(r + 1) * ((dim + 1) / 2) - 1]) >> 4, 0);
      }
      EXPECT_EQ(values(q::dequantize_embedding_weight(qw).select(0, 3)), std::vector<double>(dim, 0.0));
      EXPECT_EQ(values(q::dequantize_embedding_weight(qw).select(0, 2)), std::vector<double>(dim, 0.75));
    }
  }
}

TEST(QuantEmbedding, BagsEqualFloat64ReductionsOfTheDequantizedTable) {
  st::manual_seed(32);
  const int64_t num = 11, dim = 7;
  using Mode = st::nn::EmbeddingBagMode;
  for (int bits : {8, 4}) {
    const q::RowwiseWeight qw = q::quantize_embedding_weight(table(num, dim), bits);
    const std::vector<double> deq = values(q::dequantize_embedding_weight(qw));
    const std::vector<int64_t> ids = {3, 1, 1, 10, 4, 0, 7, 7, 2, 5, 9, 6};
    const st::Tensor idx = st::from_vector(ids);
    // bags [0, 3) [3, 3) (empty) [3, 8) [8, 12)
    const std::vector<int64_t> starts = {0, 3, 3, 8, 12};
    const st::Tensor offsets = st::from_vector(std::vector<int64_t>(starts.begin(), starts.end() - 1));
    const st::Tensor psw = st::randn({12}, st::kFloat32);
    for (Mode mode : {Mode::Sum, Mode::Mean, Mode::Max}) {
      for (std::optional<int64_t> padding : {std::optional<int64_t>(), std::optional<int64_t>(7)}) {
        const auto got = values(q::embedding_bag_rowwise(idx, qw, {offsets, mode, {}, false, padding}));
        EXPECT_EQ(got, bag_reference(deq, dim, ids, starts, {}, mode, padding ? *padding : -1))
            << "bits " << bits << " mode " << static_cast<int>(mode);
      }
    }
    // per_sample_weights, include_last_offset, int32 indices
    const std::vector<double> pw = values(psw);
    std::vector<double> pwf(pw.begin(), pw.end());
    EXPECT_EQ(values(q::embedding_bag_rowwise(idx.to(st::kInt32), qw,
                                              {st::from_vector(starts), Mode::Sum, psw, true, std::nullopt})),
              bag_reference(deq, dim, ids, starts, pwf, Mode::Sum, -1));
    // 2-d indices: one bag per row
    const st::Tensor two = idx.reshape({3, 4});
    EXPECT_EQ(values(q::embedding_bag_rowwise(two, qw, {{}, Mode::Mean})),
              bag_reference(deq, dim, ids, {0, 4, 8, 12}, {}, Mode::Mean, -1));
    // lookups: the dequantized rows exactly
    const auto looked = q::embedding_rowwise(two, qw);
    ASSERT_EQ(looked.shape(), (st::Shape{3, 4, dim}));
    EXPECT_EQ(values(looked), bag_reference(deq, dim, ids, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {},
                                            Mode::Sum, -1));
  }
}

TEST(QuantEmbedding, QuantizeDynamicConvertsEmbeddingLayers) {
  st::manual_seed(33);
  struct Model : st::nn::Module {
    st::nn::Embedding emb{20, 6, {.padding_idx = 0}};
    st::nn::EmbeddingBag bag{30, 8, {.mode = st::nn::EmbeddingBagMode::Sum}};
    st::nn::Linear fc{8, 3};
    Model() {
      register_module("emb", emb);
      register_module("bag", bag);
      register_module("fc", fc);
    }
    st::Tensor forward(const st::Tensor& x) override { return fc(bag(x)); }
  };
  for (auto dtype : {q::EmbeddingDtype::UInt8, q::EmbeddingDtype::UInt4}) {
    Model m;
    const st::Tensor emb_w = m.emb.weight.detach().clone(), bag_w = m.bag.weight.detach().clone();
    // embeddings only: the filter refuses every Linear
    q::QuantizeOptions o{.filter = [](const std::string&, const st::nn::Linear&) { return false; },
                         .embeddings = dtype};
    EXPECT_EQ(q::quantize_dynamic(m, o), 2);
    EXPECT_FALSE(m.emb.weight.defined());
    EXPECT_TRUE(m.fc.weight.defined());
    const int bits = dtype == q::EmbeddingDtype::UInt8 ? 8 : 4;
    const auto sd = m.state_dict();
    const std::string codes = bits == 8 ? "weight_uint8" : "weight_uint4x2";
    for (const std::string& key : std::vector<std::string>{"emb.quantized." + codes, "emb.quantized.weight_scale",
                                                           "bag.quantized.weight_bias"})
      EXPECT_TRUE(sd.count(key)) << key;
    EXPECT_FALSE(sd.count("emb.weight"));
    // the layers compute the functional forms on the quantized weights
    const st::Tensor ids = st::from_vector(std::vector<int64_t>{0, 5, 19, 5});
    EXPECT_EQ(values(m.emb(ids)), values(q::embedding_rowwise(ids, q::quantize_embedding_weight(emb_w, bits))));
    EXPECT_EQ(values(m.emb(ids).select(0, 0)), std::vector<double>(6, 0.0));  // padding row
    const st::Tensor offsets = st::from_vector(std::vector<int64_t>{0, 1});
    const st::Tensor psw = st::rand({4});
    EXPECT_EQ(values(m.bag(ids, offsets, psw)),
              values(q::embedding_bag_rowwise(ids, q::quantize_embedding_weight(bag_w, bits),
                                              {offsets, st::nn::EmbeddingBagMode::Sum, psw})));
    // within the bound the steps give of the float layer: sum over each bag of |w| * step / 2
    st::nn::EmbeddingBag ref(30, 8, {.mode = st::nn::EmbeddingBagMode::Sum});
    {
      st::NoGradGuard no_grad;
      ref.weight.copy_(bag_w);
    }
    const auto fq = values(m.bag(ids, offsets, psw)), ff = values(ref(ids, offsets, psw));
    const auto steps = values(q::quantize_embedding_weight(bag_w, bits).scale), pwv = values(psw);
    for (int64_t k = 0; k < 8; ++k) {
      EXPECT_LE(std::fabs(fq[k] - ff[k]), pwv[0] * steps[0] / 2 * 1.001 + 1e-5);
      const double bound1 = (pwv[1] * steps[5] + pwv[2] * steps[19] + pwv[3] * steps[5]) / 2 * 1.001 + 1e-5;
      EXPECT_LE(std::fabs(fq[8 + k] - ff[8 + k]), bound1);
    }
    // a state dict loads into a fresh quantized model
    Model fresh;
    q::quantize_dynamic(fresh, o);
    fresh.load_state_dict(sd);
    EXPECT_EQ(values(fresh.emb(ids)), values(m.emb(ids)));
    EXPECT_EQ(values(fresh.bag(ids, offsets, psw)), values(m.bag(ids, offsets, psw)));
    EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(m, o); }, {"quantized already"}));
  }
}

TEST(QuantEmbedding, BadInput) {
  const q::RowwiseWeight qw = q::quantize_embedding_weight(st::randn({5, 4}));
  const st::Tensor ids = st::from_vector(std::vector<int64_t>{0, 5});
  EXPECT_TRUE(throws_with([&] { q::embedding_rowwise(ids, qw); }, {"index 5 is out of range for 5 embeddings"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_rowwise(ids.to(st::kFloat32), qw); }, {"must be int64 or int32"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_embedding_weight(st::randn({5, 4}), 3); }, {"bits must be 8 or 4"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_embedding_weight(st::randn({5}), 8); }, {"expects a floating weight"}));
  const st::Tensor two = st::zeros({2, 2}, st::kInt64);
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(two, qw, {{}, st::nn::EmbeddingBagMode::Mean,
                                                                   st::ones({2, 2})}); },
                          {"only supported with mode Sum"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(st::zeros({3}, st::kInt64), qw,
                                                         {st::from_vector(std::vector<int64_t>{1})}); },
                          {"first offset must be 0"}));
  q::RowwiseWeight bad = qw;
  bad.scale = st::ones({4});
  EXPECT_TRUE(throws_with([&] { q::embedding_rowwise(ids, bad); }, {"floating scales and biases"}));
  q::QuantizeOptions o;
  o.embeddings = static_cast<q::EmbeddingDtype>(7);
  st::nn::Embedding e(3, 2);
  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(e, o); }, {"unknown embedding dtype"}));
}

// A row from -3e38 to 3e38: max - min overflows float32 and no float32 scale dequantizes it (the
// scale was inf and every value NaN): refused, naming the row; 1e38 wide still quantizes within half a step.
TEST(QuantEmbedding, RowsSpanningFloat32sRange) {
  st::Tensor w = st::zeros({3, 4});
  {
    st::NoGradGuard no_grad;
    w.select(0, 0).copy_(st::from_vector(std::vector<double>{-1e38, 1e38, 0, 3e37}).to(st::kFloat32));
  }
  const std::vector<double> wv = values(w);
  for (int bits : {8, 4}) {
    const std::vector<double> deq = values(q::dequantize_embedding_weight(q::quantize_embedding_weight(w, bits)));
    const double half_step = (wv[1] - wv[0]) / (bits == 8 ? 255 : 15) / 2;
    for (size_t k = 0; k < 4; ++k)
      EXPECT_LE(std::fabs(deq[k] - wv[k]), half_step * (1 + 1e-5)) << "bits " << bits << " col " << k;
  }
  {
    st::NoGradGuard no_grad;
    w.select(0, 2).copy_(st::from_vector(std::vector<double>{-3e38, 3e38, 0, 1}).to(st::kFloat32));
  }
  for (int bits : {8, 4})
    EXPECT_TRUE(throws_with([&] { q::quantize_embedding_weight(w, bits); }, {"row 2 spans more than float32 holds"}));
}

TEST(QuantEmbedding, BadIndicesAndOffsets) {
  const q::RowwiseWeight qw = q::quantize_embedding_weight(st::randn({5, 4}), 4);
  const auto ints = [](std::vector<int64_t> v) { return st::from_vector(v); };
  using Mode = st::nn::EmbeddingBagMode;
  EXPECT_TRUE(throws_with([&] { q::embedding_rowwise(ints({2, -1}), qw); }, {"index -1 is out of range"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_rowwise(ints({7}).to(st::kInt32), qw); }, {"index 7 is out of range"}));
  const st::Tensor ids = ints({0, 1, 2, 3});
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ints({0, -2}), qw, {ints({0})}); }, {"out of range"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ids, qw, {ints({0, 3, 2, 4}), Mode::Sum, {}, true}); },
                          {"ascending"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ids, qw, {ints({1, 4}), Mode::Sum, {}, true}); },
                          {"first offset must be 0"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ids, qw, {ints({0, 3}), Mode::Sum, {}, true}); },
                          {"last offset must be the number of indices"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ids, qw, {ints({0, 5})}); }, {"at most the number"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ids, qw, {ints({0, 2}), Mode::Sum, st::ones({3})}); },
                          {"per_sample_weights must be floating, of the indices' shape"}));
  EXPECT_TRUE(throws_with([&] { q::embedding_bag_rowwise(ids, qw, {ints({0, 2}), Mode::Sum, {}, false, 9}); },
                          {"padding_idx 9 is out of range"}));
  // int32 offsets, an empty bag first: Max gives 0 there, as torch
  const auto out = values(q::embedding_bag_rowwise(ids, qw, {ints({0, 0}).to(st::kInt32), Mode::Max}));
  EXPECT_EQ(std::vector<double>(out.begin(), out.begin() + 4), std::vector<double>(4, 0.0));
}

// Module::to(kFloat16) converts the form's floating buffers (scale and bias) as it does the int8 forms':
// the layer then computes with the rounded qparams, within their rounding of the float32 result.
TEST(QuantEmbedding, FormRunsAfterModuleToHalf) {
  st::manual_seed(34);
  st::nn::EmbeddingBag bag(10, 6, {.mode = st::nn::EmbeddingBagMode::Mean});
  q::quantize_dynamic(bag, {.embeddings = q::EmbeddingDtype::UInt4});
  const st::Tensor ids = st::from_vector(std::vector<int64_t>{0, 1, 2, 3, 9});
  const st::Tensor offsets = st::from_vector(std::vector<int64_t>{0, 2});
  const std::vector<double> before = values(bag(ids, offsets));
  const std::vector<double> scale = values(bag.state_dict().at("quantized.weight_scale")),
                            bias = values(bag.state_dict().at("quantized.weight_bias"));
  bag.to(st::kFloat16);
  ASSERT_EQ(bag.state_dict().at("quantized.weight_scale").dtype(), st::kFloat16);
  double bound = 0;  // a half rounds within 2^-11 relative: |code * d_scale + d_bias|
  for (size_t r = 0; r < scale.size(); ++r) bound = std::max(bound, (15 * scale[r] + std::fabs(bias[r])) / 2048);
  const std::vector<double> after = values(bag(ids, offsets));
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], before[i], bound * 1.01) << i;
}

TEST(QuantEmbedding, ResetParametersOfAConvertedLayerRaises) {
  st::nn::Embedding emb(6, 4);
  st::nn::EmbeddingBag bag(6, 4);
  q::quantize_dynamic(emb, {.embeddings = q::EmbeddingDtype::UInt8});
  q::quantize_dynamic(bag, {.embeddings = q::EmbeddingDtype::UInt4});
  EXPECT_TRUE(throws_with([&] { emb.reset_parameters(); }, {"[Embedding] reset_parameters", "\"quantized\""}));
  EXPECT_TRUE(throws_with([&] { bag.reset_parameters(); }, {"[EmbeddingBag] reset_parameters", "\"quantized\""}));
}
