// The integer GEMMs at the ends of their ranges: the largest codes at the longest K the checks
// allow, where a saturating int16 pair sum or an int32 overflow would show; and the weight row
// sums of the int8 layer following a replaced weight and computed by threads sharing the layer;
// the int4 Linear across its weight tiles; per-channel work on transposed inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::throws_with;
using st::testing::values;

TEST(QuantExtremes, Int8MmLongestKOfExtremeCodes) {
  // int8 x int8 at -128 * -128 every step: the sum is K * 2^14, which int32 holds up to K = 2^17 - 1
  const int64_t K = (int64_t{1} << 17) - 1;
  const st::Tensor a = st::full({5, K}, -128.0, st::kInt8);
  const st::Tensor b = st::full({K, 6}, -128.0, st::kInt8);
  const std::vector<double> c = values(q::int8_mm(a, b));
  for (double v : c) ASSERT_EQ(int64_t(v), K * 16384);
  const st::Tensor a2 = st::full({1, K + 1}, -128.0, st::kInt8), b2 = st::full({K + 1, 1}, -128.0, st::kInt8);
  EXPECT_TRUE(throws_with([&] { q::int8_mm(a2, b2); }, {"int8_mm", "overflow"}));
}

TEST(QuantExtremes, Int8LinearExactAtFullCodesAndLongestK) {
  // a row of 0 and 255 quantizes to itself (scale 1, zero point 0); weight codes 127 and -128 with
  // scale 1 make the output the integer sum itself. Pairs 255 * 127 + 255 * 127 pass int16, so a
  // saturating multiply-add (vpmaddubsw) would be caught; K = 2^16 is the longest the layer takes.
  for (int64_t K : {int64_t{96}, int64_t{1} << 16}) {
    std::vector<float> x(2 * K), codes(4 * K);
    for (int64_t k = 0; k < K; ++k) {
      x[k] = 255.0f;                                        // row 0: all 255
      x[K + k] = (k % 3 == 0 || k == K - 1) ? 255.f : 0.f;  // row 1: 0 and 255, both present
      codes[k] = 127.0f;
      codes[K + k] = -128.0f;
      codes[2 * K + k] = k % 2 ? 127.0f : -128.0f;
      codes[3 * K + k] = (k % 5 == 0) ? -128.0f : 127.0f;
    }
    const st::Tensor xt = st::from_vector(x, st::Shape{2, K});
    const q::Int8Weight qw{st::from_vector(codes, st::Shape{4, K}).to(st::kInt8), st::ones({4})};
    const std::vector<double> y = values(q::linear_int8_dynamic(xt, qw, st::Tensor()));
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t n = 0; n < 4; ++n) {
        int64_t sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += int64_t(x[m * K + k]) * int64_t(codes[n * K + k]);
        EXPECT_NEAR(y[m * 4 + n], double(sum), 1e-6 * std::abs(double(sum))) << "K " << K << " at " << m << "," << n;
      }
  }
}

TEST(QuantExtremes, Int8LayerRowSumsFollowReplacedCodes) {
  // the layer caches each weight row's code sum (for the activations' zero points); codes given
  // new memory (set_data on the buffer, as Module::to does) must not be paired with the old sums
  st::manual_seed(30);
  st::nn::Linear layer(40, 6);
  q::quantize_dynamic(layer);
  const st::Tensor x = st::randn({3, 40}) + 1.0;  // a non-zero zero point makes the sums matter
  layer(x);                                        // computes the sums of the first codes
  const q::Int8Weight other = q::quantize_weight_int8(st::randn({6, 40}));
  for (auto& [name, t] : layer.named_buffers()) {
    if (name == "quantized.weight_int8") t.set_data(other.codes);
    if (name == "quantized.weight_scale") t.set_data(other.scale);
  }
  const std::vector<double> want = values(q::linear_int8_dynamic(x, other, layer.bias));
  EXPECT_TRUE(st::testing::all_close(layer(x), want, 0, 0));
}

TEST(QuantExtremes, Int4LinearAcrossWeightTiles) {
  // more weight rows than one dequantized tile (256), an odd count, so later tiles write their
  // columns at an offset into the output
  st::manual_seed(31);
  const int64_t M = 3, N = 301, K = 64;
  const st::Tensor w = st::randn({N, K}), x = st::randn({M, K}), bias = st::randn({N});
  const q::Int4Weight p = q::quantize_weight_int4(w, 32, false);
  const std::vector<double> wd = values(q::dequantize_weight_int4(p)), xv = values(x), bv = values(bias);
  std::vector<double> want(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bv[n];
      for (int64_t k = 0; k < K; ++k) s += xv[m * K + k] * wd[n * K + k];
      want[m * N + n] = s;
    }
  EXPECT_TRUE(st::testing::all_close(q::linear_int4(x, p, bias), want, 1e-5, 1e-4));
  // a hand-made weight whose group size is odd cannot address its nibbles by byte
  q::Int4Weight odd{st::zeros({2, 3}, st::kUInt8), st::ones({2, 2}), st::Tensor(), 3};
  EXPECT_TRUE(throws_with([&] { q::linear_int4(st::randn({1, 6}), odd); }, {"linear_int4", "group"}));
}

TEST(QuantExtremes, Int8LayerSharedByThreads) {
  // inference threads sharing a freshly quantized layer race to compute its row sums first
  st::manual_seed(32);
  st::nn::Linear layer(64, 33);
  q::quantize_dynamic(layer);
  const st::Tensor x = st::randn({5, 64}) + 0.5;
  const q::Int8Weight w{layer.form()->named_buffers().at(0).second, layer.form()->named_buffers().at(1).second};
  const std::vector<double> want = values(q::linear_int8_dynamic(x, w, layer.bias));
  std::vector<std::vector<double>> got(6);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = values(layer(x)); });
  for (std::thread& t : threads) t.join();
  for (const std::vector<double>& g : got) EXPECT_EQ(g, want);
}

TEST(QuantExtremes, PerChannelOnTransposedInputs) {
  // a transposed (non-contiguous) input along a non-zero axis: the codes, the fake quant and the
  // observer's ranges are those of its contiguous copy, element by element
  st::manual_seed(33);
  const st::Tensor base = st::randn({5, 3}) * 3.0;
  const st::Tensor x = base.t();  // (3, 5), channels along dim 1 are base's rows
  ASSERT_FALSE(x.is_contiguous());
  const st::Tensor s = st::tensor({0.5f, 0.25f, 0.125f, 1.0f, 0.75f}), z = st::tensor({0, 3, -5, 10, -1}, st::kInt32);
  const std::vector<double> xv = values(x.contiguous()), codes = values(q::quantize_per_channel(x, s, z, 1,
                                                                                                st::kInt8).int_repr);
  const std::vector<double> fq = values(q::fake_quantize_per_channel_affine(x, s, z, 1, -128, 127));
  const double sv[] = {0.5, 0.25, 0.125, 1.0, 0.75};
  const int zv[] = {0, 3, -5, 10, -1};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = int(i % 5);
    const double code = std::clamp(double(zv[c] + std::nearbyint(float(xv[i]) * float(1 / sv[c]))), -128.0, 127.0);
    EXPECT_EQ(codes[i], code) << i;
    EXPECT_EQ(fq[i], (code - zv[c]) * sv[c]) << i;
  }
  q::PerChannelMinMaxObserver obs(q::ObserverOptions{.dtype = st::kInt8, .qscheme = q::QScheme::PerChannelSymmetric,
                                                     .ch_axis = 1});
  obs(x);
  const std::vector<double> lo = values(obs.min_val), hi = values(obs.max_val), bv = values(base);
  for (int c = 0; c < 5; ++c) {
    EXPECT_EQ(lo[c], std::min({bv[c * 3], bv[c * 3 + 1], bv[c * 3 + 2]})) << c;
    EXPECT_EQ(hi[c], std::max({bv[c * 3], bv[c * 3 + 1], bv[c * 3 + 2]})) << c;
  }
}
