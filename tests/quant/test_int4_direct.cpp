// The int4 Linear's kernel for few rows (codes decoded in registers, kernels/cpu/int4_gemv.h)
// against float64 math written here: the codes unpacked from the bytes, dequantized, multiplied.
// Shapes cover every group size the kernel distinguishes (a multiple of 128 codes, of 32, and
// groups the vector runs do not divide), 1..17 rows and the row bound (32 direct, 33 through the
// float GEMM), out_features that no tile width divides, symmetric and asymmetric, with and
// without bias; and the same layer with the kernel switched off.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::values;

namespace {

// Random codes, scales and (asymmetric) zero points in the documented layout: any even group
// that divides K, as a user may build, not only what quantize_weight_int4 makes.
q::Int4Weight random_weight(int64_t N, int64_t K, int64_t group, bool symmetric) {
  q::Int4Weight w;
  w.packed = st::randint(0, 256, {N, K / 2}).to(st::kUInt8);
  w.scale = st::rand({N, K / group}) * 0.2 + 0.01;
  if (!symmetric) w.zero_point = st::randint(0, 16, {N, K / group}).to(st::kUInt8);
  w.group_size = group;
  return w;
}

// The float64 weight: element 2j of a row in the low nibble of byte j, (code - zero) * scale.
std::vector<double> dequantized(const q::Int4Weight& w) {
  const int64_t N = w.packed.size(0), K = 2 * w.packed.size(1), groups = K / w.group_size;
  const std::vector<double> bytes = values(w.packed), scale = values(w.scale);
  const std::vector<double> zero = w.zero_point.defined() ? values(w.zero_point) : std::vector<double>(N * groups, 8);
  std::vector<double> out(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int byte = int(bytes[n * K / 2 + k / 2]), code = k % 2 ? byte >> 4 : byte & 15;
      const int64_t g = n * groups + k / w.group_size;
      // the scale times an exact small integer, rounded to float32 as the stored weight would be
      out[n * K + k] = double(float((code - zero[g]) * float(scale[g])));
    }
  return out;
}

// y against x . w^T + bias in float64, each output within the rounding of float32 sums of K
// products: (K / 16 + 32) float32 epsilons of sum_k |x_k w_k| (a vector of 16 lanes summed
// blockwise), and within 1e-30 where that sum is 0.
::testing::AssertionResult matches(const st::Tensor& y, const st::Tensor& x, const std::vector<double>& w,
                                   const st::Tensor& bias) {
  const int64_t M = x.size(0), K = x.size(1), N = static_cast<int64_t>(w.size()) / K;
  const std::vector<double> xv = values(x), yv = values(y), bv = bias.defined() ? values(bias) : std::vector<double>(N);
  const double eps = std::numeric_limits<float>::epsilon() * double(K / 16 + 32);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bv[n], mag = std::fabs(bv[n]);
      for (int64_t k = 0; k < K; ++k) {
        s += xv[m * K + k] * w[n * K + k];
        mag += std::fabs(xv[m * K + k] * w[n * K + k]);
      }
      if (!(std::fabs(yv[m * N + n] - s) <= eps * mag + 1e-30))
        return ::testing::AssertionFailure() << "y[" << m << ", " << n << "] = " << yv[m * N + n] << ", want " << s
                                             << " (M " << M << ", N " << N << ", K " << K << ")";
    }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(QuantInt4Direct, MatchesFloat64OverGroupsRowsAndSchemes) {
  st::manual_seed(11);
  const int64_t N = 13;  // no multiple of the 4- and 6-row tiles: every ragged end runs
  // (group, K): multiples of 128 codes (the 8-codes-per-lane path), of 32 (a byte per lane), and
  // even groups neither divides (a byte at a time)
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{128, 384}, {256, 512}, {32, 96}, {64, 320},
                                                           {96, 192},  {48, 144},  {6, 42},  {2, 10}};
  for (auto [group, K] : shapes)
    for (bool symmetric : {true, false}) {
      const q::Int4Weight w = random_weight(N, K, group, symmetric);
      const std::vector<double> wd = dequantized(w);
      const st::Tensor bias = st::randn({N});
      for (int64_t M : {1, 2, 3, 5, 8, 16, 17, 32, 33}) {
        const st::Tensor x = st::randn({M, K});
        EXPECT_TRUE(matches(q::linear_int4(x, w, bias), x, wd, bias)) << "group " << group << " sym " << symmetric;
        EXPECT_TRUE(matches(q::linear_int4(x, w), x, wd, st::Tensor())) << "group " << group << " no bias";
      }
    }
}

TEST(QuantInt4Direct, DecodesEveryCodeToItsDequantizedWeightExactly) {
  // rows of the identity pick single weights: one product and zeros, so each output is the
  // dequantized weight itself, bit for bit, wherever the kernel reorders codes and activations
  st::manual_seed(12);
  for (auto [group, K] : std::vector<std::pair<int64_t, int64_t>>{{128, 256}, {32, 64}, {6, 18}})
    for (bool symmetric : {true, false}) {
      const int64_t N = 7;
      const q::Int4Weight w = random_weight(N, K, group, symmetric);
      const std::vector<double> want = values(q::dequantize_weight_int4(w)), wd = dequantized(w);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], wd[i]) << i;
      const st::Tensor eye = st::eye(K);
      for (int64_t k0 = 0; k0 < K; k0 += 17) {  // blocks of up to 17 rows: the direct kernel
        const int64_t rows = std::min<int64_t>(17, K - k0);
        const std::vector<double> y = values(q::linear_int4(eye.narrow(0, k0, rows).contiguous(), w));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t n = 0; n < N; ++n) ASSERT_EQ(y[r * N + n], want[n * K + k0 + r]) << "k " << k0 + r;
      }
    }
}

TEST(QuantInt4Direct, ThreadsSwitchAndNonFiniteRows) {
  st::manual_seed(13);
  const int64_t M = 3, K = 1024, N = 203;  // enough weight rows for two threads to split
  const q::Int4Weight w = q::quantize_weight_int4(st::randn({N, K}), 128, false);
  const std::vector<double> wd = dequantized(w);
  const st::Tensor x = st::randn({M, K}), bias = st::randn({N});
  const int threads = st::get_num_threads();
  for (int t : {1, 2}) {
    st::set_num_threads(t);
    EXPECT_TRUE(matches(q::linear_int4(x, w, bias), x, wd, bias)) << t << " threads";
  }
  st::set_num_threads(threads);
  // switched off, the dequantized tiles and the float GEMM: the same result up to float32 sums
  q::set_int4_direct_kernel(false);
  EXPECT_FALSE(q::int4_direct_kernel_enabled());
  EXPECT_TRUE(matches(q::linear_int4(x, w, bias), x, wd, bias));
  q::set_int4_direct_kernel(true);
  // a NaN or an inf in a row reaches that row's outputs alone, as in a float product
  std::vector<float> xv(M * K, 0.5f);
  xv[K + 5] = std::numeric_limits<float>::quiet_NaN();
  xv[2 * K + 9] = std::numeric_limits<float>::infinity();
  const std::vector<double> y = values(q::linear_int4(st::from_vector(xv, st::Shape{M, K}), w));
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_TRUE(std::isfinite(y[n])) << n;
    EXPECT_TRUE(std::isnan(y[N + n])) << n;
    const double w9 = wd[n * K + 9];  // inf times the weight: +-inf, or NaN where it is 0
    EXPECT_TRUE(w9 == 0 ? std::isnan(y[2 * N + n]) : std::isinf(y[2 * N + n])) << n;
  }
}

TEST(QuantInt4Direct, EmptyShapes) {
  st::manual_seed(14);
  const q::Int4Weight w = random_weight(5, 64, 32, false);
  const st::Tensor bias = st::randn({5});
  EXPECT_EQ(q::linear_int4(st::randn({0, 64}), w, bias).shape(), (st::Shape{0, 5}));
  // no in_features: every output is the bias (an empty sum)
  const q::Int4Weight none = random_weight(5, 0, 32, true);
  EXPECT_TRUE(st::testing::all_close(q::linear_int4(st::randn({3, 0}), none, bias), [&] {
    const std::vector<double> b = values(bias);
    std::vector<double> want;
    for (int m = 0; m < 3; ++m) want.insert(want.end(), b.begin(), b.end());
    return want;
  }(), 0, 0));
}
