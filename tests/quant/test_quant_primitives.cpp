// Quantization primitives against float64 math written here: quantize/dequantize per tensor and
// per channel (ties, clamping, NaN and inf), the observers' qparams formula, the exact int8 GEMM
// and the int4 packing and GEMM.
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::throws_with;
using st::testing::values;

namespace {

// round half to even in float64, independent of the library
double round_half_even(double v) {
  const double f = std::floor(v), frac = v - f;
  if (frac < 0.5) return f;
  if (frac > 0.5) return f + 1;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

double ref_code(double x, double scale, int zp, int qmin, int qmax) {
  if (std::isnan(x)) return zp;
  return std::clamp(zp + round_half_even(x / scale), double(qmin), double(qmax));
}

}  // namespace

TEST(QuantPrimitives, PerTensorTiesClampAndNonFinite) {
  // scale a power of two: x / scale is exact in float, so float32 and float64 agree to the bit
  const double scale = 0.25;
  std::vector<float> xs = {0.125f, 0.375f, -0.125f, -0.375f, 0.625f, 1.0f, -1.0f, 31.0f, 32.0f, -40.0f, 1e30f,
                           -1e30f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f};
  const st::Tensor x = st::from_vector(xs);
  for (auto [dtype, zp] : {std::pair{st::kUInt8, 128}, std::pair{st::kInt8, -3}, std::pair{st::kUInt8, 0}}) {
    const q::QRange r = q::quant_range(dtype);
    q::QuantizedTensor qt = q::quantize_per_tensor(x, scale, zp, dtype);
    ASSERT_EQ(qt.int_repr.dtype(), dtype);
    const std::vector<double> got = values(qt.int_repr), back = values(qt.dequantize());
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = ref_code(xs[i], scale, zp, r.quant_min, r.quant_max);
      EXPECT_EQ(got[i], want) << "x = " << xs[i] << " zp " << zp;
      EXPECT_EQ(back[i], (want - zp) * scale) << "x = " << xs[i];
    }
  }
  // ties go to even codes: 0.125 / 0.25 = 0.5 -> 0, 0.375 / 0.25 = 1.5 -> 2
  EXPECT_EQ(values(q::quantize_per_tensor(st::tensor({0.125f, 0.375f}), 0.25, 0, st::kInt8).int_repr),
            (std::vector<double>{0, 2}));
}

TEST(QuantPrimitives, PerTensorRandomScaleMatchesFloat64) {
  st::manual_seed(1);
  const st::Tensor x = st::randn({1000}) * 3.0;
  const double scale = 0.0371;
  const int zp = 7;
  const std::vector<double> got = values(q::quantize_per_tensor(x, scale, zp, st::kInt8).int_repr), xv = values(x);
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i] / scale, want = ref_code(xv[i], scale, zp, -128, 127);
    // float32's x * (1 / scale) may land on the other side of a tie that float64 resolves
    const bool near_tie = std::fabs(v - std::floor(v) - 0.5) < 1e-4;
    EXPECT_TRUE(got[i] == want || (near_tie && std::fabs(got[i] - want) == 1)) << i << ": " << xv[i];
  }
}

TEST(QuantPrimitives, PerChannelAlongMiddleAxis) {
  st::manual_seed(2);
  const st::Tensor x = st::randn({3, 4, 5}) * 2.0;
  const st::Tensor scales = st::tensor({0.5f, 0.125f, 0.25f, 1.0f});
  const st::Tensor zps = st::tensor({0, 3, -5, 100}, st::kInt32);
  q::QuantizedTensor qt = q::quantize_per_channel(x, scales, zps, 1, st::kInt8);
  EXPECT_EQ(qt.axis, 1);
  const std::vector<double> got = values(qt.int_repr), back = values(qt.dequantize()), xv = values(x);
  const double s[] = {0.5, 0.125, 0.25, 1.0};
  const int z[] = {0, 3, -5, 100};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / 5) % 4);
    const double want = ref_code(xv[i], s[c], z[c], -128, 127);
    EXPECT_EQ(got[i], want) << i;
    EXPECT_EQ(back[i], (want - z[c]) * s[c]) << i;
  }
}

TEST(QuantPrimitives, QparamsFollowTheObserverFormula) {
  // float64 formula of _calculate_qparams, eps = float32 epsilon
  const double eps = std::numeric_limits<float>::epsilon();
  struct Case {
    float lo, hi;
  };
  const std::vector<Case> cases = {{-1.5f, 2.25f}, {0.3f, 4.0f}, {-7.0f, -0.5f}, {0.0f, 0.0f}, {-1e-9f, 1e-9f}};
  for (bool symmetric : {false, true})
    for (st::DType dtype : {st::kInt8, st::kUInt8})
      for (const Case& c : cases) {
        const q::QRange r = q::quant_range(dtype);
        auto [scale, zp] = q::calculate_qparams(st::scalar_tensor(c.lo), st::scalar_tensor(c.hi), r, symmetric);
        const double lo = std::min<double>(c.lo, 0), hi = std::max<double>(c.hi, 0);
        double want_scale, want_zp;
        if (symmetric) {
          want_scale = std::max(std::max(-lo, hi) / ((r.quant_max - r.quant_min) / 2.0), eps);
          want_zp = dtype == st::kUInt8 ? 128 : 0;
        } else {
          want_scale = std::max((hi - lo) / (r.quant_max - r.quant_min), eps);
          want_zp = std::clamp(r.quant_min - round_half_even(lo / float(want_scale)), double(r.quant_min),
                               double(r.quant_max));
        }
        EXPECT_NEAR(scale.item<float>(), want_scale, want_scale * 1e-6) << c.lo << " " << c.hi;
        EXPECT_EQ(zp.item<int32_t>(), want_zp) << c.lo << " " << c.hi << " symmetric " << symmetric;
        // zero is exactly representable
        q::QuantizedTensor z = q::quantize_per_tensor(st::zeros({1}), scale.item<float>(), zp.item<int32_t>(), dtype);
        EXPECT_EQ(z.dequantize().item<float>(), 0.0f);
      }
  // ranges are taken over finite values only
  auto [lo, hi] = q::finite_aminmax(st::tensor({1.0f, std::numeric_limits<float>::quiet_NaN(), -2.0f,
                                                std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(lo.item<float>(), -2.0f);
  EXPECT_EQ(hi.item<float>(), 1.0f);
}

TEST(QuantPrimitives, BadInputRaises) {
  const st::Tensor x = st::randn({4, 3});
  EXPECT_TRUE(throws_with([&] { q::quantize_per_tensor(st::ones({3}, st::kInt32), 0.1, 0, st::kInt8); },
                          {"quantize_per_tensor", "floating"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_per_tensor(x, 0.0, 0, st::kInt8); }, {"scale"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_per_tensor(x, 1e-50, 0, st::kInt8); }, {"float32"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_per_tensor(x, 0.1, 300, st::kUInt8); }, {"zero_point 300"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_per_tensor(x, 0.1, 0, st::kFloat32); }, {"int8 or uint8"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_per_channel(x, st::ones({4}), st::zeros({3}, st::kInt32), 1, st::kInt8); },
                          {"quantize_per_channel", "shape (3)"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_per_channel(x, st::ones({3}), st::zeros({3}, st::kInt32), 2, st::kInt8); },
                          {"axis 2"}));
  EXPECT_TRUE(
      throws_with([&] { q::quantize_per_channel(x, -st::ones({4}), st::zeros({4}, st::kInt32), 0, st::kInt8); },
                  {"positive"}));
}

TEST(QuantInt8Gemm, ExactAgainstInt64OnOddSizes) {
  st::manual_seed(3);
  for (auto [M, K, N] : {std::tuple{7, 37, 13}, std::tuple{1, 1, 1}, std::tuple{3, 1000, 5}, std::tuple{16, 64, 9}}) {
    st::Tensor a = st::randint(-128, 128, {M, K}).to(st::kInt8);
    st::Tensor b = st::randint(-128, 128, {K, N}).to(st::kInt8);
    if (M == 3) {  // the extremes everywhere: the largest sums there are
      a = st::full({M, K}, -128, st::kInt8);
      b = st::full({K, N}, -128, st::kInt8);
    }
    const st::Tensor c = q::int8_mm(a, b);
    ASSERT_EQ(c.dtype(), st::kInt32);
    const std::vector<double> av = values(a), bv = values(b), cv = values(c);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int64_t want = 0;
        for (int k = 0; k < K; ++k) want += int64_t(av[m * K + k]) * int64_t(bv[k * N + n]);
        ASSERT_EQ(int64_t(cv[m * N + n]), want) << M << "x" << K << "x" << N << " at " << m << "," << n;
      }
  }
  EXPECT_TRUE(throws_with([] { q::int8_mm(st::zeros({2, 3}, st::kInt8), st::zeros({2, 3}, st::kInt8)); },
                          {"int8_mm", "(K, N)"}));
  EXPECT_TRUE(throws_with([] { q::int8_mm(st::zeros({2, 3}), st::zeros({3, 3}, st::kInt8)); }, {"int8"}));
}

TEST(QuantInt4, PackUnpackRoundTripAndLayout) {
  // a weight made of exact codes -8..7 times 0.5, both ends in every group: asymmetric int4 gives
  // scale 0.5 and zero point 8, and the weight back bit for bit
  const int64_t N = 3, K = 64, G = 32;
  std::vector<float> w(N * K);
  for (int64_t i = 0; i < N * K; ++i) w[i] = float((i * 7) % 16 - 8) * 0.5f;
  const st::Tensor wt = st::from_vector(w, st::Shape{N, K});
  q::Int4Weight p = q::quantize_weight_int4(wt, G, false);
  EXPECT_EQ(p.packed.shape(), (st::Shape{N, K / 2}));
  EXPECT_EQ(p.scale.shape(), (st::Shape{N, K / G}));
  EXPECT_TRUE(all_close(p.scale, std::vector<double>(N * K / G, 0.5), 0, 0));
  EXPECT_TRUE(all_close(p.zero_point, std::vector<double>(N * K / G, 8), 0, 0));
  EXPECT_TRUE(all_close(q::dequantize_weight_int4(p), values(wt), 0, 0));
  // element 2j in the low nibble of byte j
  const std::vector<double> bytes = values(p.packed);
  for (int64_t j = 0; j < N * K / 2; ++j) {
    const int lo = int(w[2 * j] / 0.5f) + 8, hi = int(w[2 * j + 1] / 0.5f) + 8;
    ASSERT_EQ(int(bytes[j]), lo | (hi << 4)) << j;
  }
  // random weights, both schemes and every group size: within half a step of their group's scale
  st::manual_seed(4);
  const st::Tensor r = st::randn({5, 128}) * 3.0;
  for (bool symmetric : {true, false})
    for (int64_t g : {32, 64, 128}) {
      q::Int4Weight a = q::quantize_weight_int4(r, g, symmetric);
      EXPECT_EQ(a.zero_point.defined(), !symmetric);
      const std::vector<double> back = values(q::dequantize_weight_int4(a)), rv = values(r), sv = values(a.scale);
      for (size_t i = 0; i < rv.size(); ++i)
        ASSERT_LE(std::fabs(back[i] - rv[i]), sv[(i / 128) * (128 / g) + (i % 128) / g] * 0.5 + 1e-6) << i;
    }
}

TEST(QuantInt4, GemmMatchesFloat64OnDequantizedWeights) {
  st::manual_seed(5);
  const int64_t N = 11, K = 192;
  const st::Tensor w = st::randn({N, K}), bias = st::randn({N});
  for (int64_t M : {1, 37})
  for (bool symmetric : {true, false}) {
    q::Int4Weight p = q::quantize_weight_int4(w, 64, symmetric);
    const std::vector<double> wd = values(q::dequantize_weight_int4(p)), bv = values(bias);
    for (st::DType dt : {st::kFloat32, st::kBFloat16}) {
      const st::Tensor x = st::randn({M, K}).to(dt);
      const st::Tensor y = q::linear_int4(x, p, bias);
      ASSERT_EQ(y.dtype(), dt);
      const std::vector<double> xv = values(x);
      std::vector<double> want(M * N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = bv[n];
          for (int64_t k = 0; k < K; ++k) s += xv[m * K + k] * wd[n * K + k];
          want[m * N + n] = s;
        }
      const double tol = dt == st::kFloat32 ? 1e-4 : 0.06;  // bfloat16 rounds the output to 8 bits
      EXPECT_TRUE(all_close(y, want, dt == st::kFloat32 ? 1e-5 : 8e-3, tol)) << "symmetric " << symmetric;
    }
  }
  q::Int4Weight p = q::quantize_weight_int4(w, 64);
  EXPECT_TRUE(throws_with([&] { q::linear_int4(st::randn({2, K + 1}), p); }, {"linear_int4", "(*, 192)"}));
  EXPECT_TRUE(throws_with([&] { q::linear_int4(st::ones({2, K}, st::kInt32), p); }, {"floating"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_weight_int4(st::randn({4, 96}), 64); }, {"does not divide", "96"}));
  EXPECT_TRUE(throws_with([&] { q::quantize_weight_int4(st::randn({4, 96}), 48); }, {"32, 64 or 128"}));
}
