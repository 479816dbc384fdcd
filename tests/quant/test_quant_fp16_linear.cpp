// float16 dynamic quantization of Linear (quantize_dynamic with WeightDtype::Float16): the weight
// stored as float16 (rounded to nearest even, saturated at 65504), the product in float32, against a
// float64 reference with the float16 rounding written out; the state dict and a saturated weight.
#include <cmath>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::values;

namespace {

// v rounded to float16 (round half to even; subnormals below 2^-14 with spacing 2^-24), saturated.
double to_half(double v) {
  if (v == 0) return v;
  const int e = std::max(std::ilogb(v), -14);
  const double ulp = std::ldexp(1.0, e - 10);
  return std::clamp(std::nearbyint(v / ulp) * ulp, -65504.0, 65504.0);
}

}  // namespace

TEST(Float16DynamicLinear, WeightInFloat16ProductInFloat32) {
  st::manual_seed(51);
  nn::Sequential model(nn::Linear(13, 7), nn::ReLU(), nn::Linear(7, 3, {.bias = false}));
  const st::Tensor w0 = model.at<nn::Linear>(0).weight.clone(), b0 = model.at<nn::Linear>(0).bias.clone();
  const st::Tensor w2 = model.at<nn::Linear>(2).weight.clone();
  EXPECT_EQ(q::quantize_dynamic(model, {.dtype = q::WeightDtype::Float16}), 2);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.count("0.weight"), 0u);
  EXPECT_EQ(sd.at("0.quantized.weight_fp16").dtype(), st::kFloat16);
  std::vector<double> h0 = values(w0), h2 = values(w2);
  for (double& v : h0) v = to_half(v);
  for (double& v : h2) v = to_half(v);
  EXPECT_TRUE(all_close(sd.at("0.quantized.weight_fp16"), h0, 0, 0));
  const st::Tensor x = st::randn({5, 2, 13});
  const st::Tensor y = model(x);
  const st::Tensor hidden = st::relu(st::matmul(x.to(st::kFloat64), st::from_vector(h0, st::Shape{7, 13}).t()) +
                                     b0.to(st::kFloat64));
  const st::Tensor want = st::matmul(hidden, st::from_vector(h2, st::Shape{3, 7}).t());
  EXPECT_EQ(y.shape(), (st::Shape{5, 2, 3}));
  EXPECT_EQ(y.dtype(), st::kFloat32);
  EXPECT_TRUE(all_close(y, values(want), 1e-5, 1e-5));
  // a float64 input computes in float64
  EXPECT_TRUE(all_close(model(x.to(st::kFloat64)), values(want), 1e-12, 1e-12));
  // the state dict loads into another model quantized the same way
  nn::Sequential twin(nn::Linear(13, 7), nn::ReLU(), nn::Linear(7, 3, {.bias = false}));
  q::quantize_dynamic(twin, {.dtype = q::WeightDtype::Float16});
  EXPECT_FALSE(all_close(twin(x), values(y), 0, 0));
  twin.load_state_dict(sd);
  EXPECT_TRUE(all_close(twin(x), values(y), 0, 0));
  EXPECT_TRUE(st::testing::throws_with([&] { q::quantize_dynamic(twin, {.dtype = q::WeightDtype::Float16}); },
                                       {"quantized", "already"}));
}

TEST(Float16DynamicLinear, SaturatesWeightsBeyondTheFloat16Range) {
  nn::Linear fc(2, 2, {.bias = false});
  {
    st::NoGradGuard no_grad;
    fc.weight.copy_(st::from_vector(std::vector<double>{1e6, -1e6, 0.5, 70000.0}, st::Shape{2, 2}));
  }
  q::quantize_dynamic(fc, {.dtype = q::WeightDtype::Float16});
  EXPECT_TRUE(all_close(fc.state_dict().at("quantized.weight_fp16"), {65504, -65504, 0.5, 65504}, 0, 0));
  const st::Tensor ones = st::from_vector(std::vector<double>{1, 1}, st::Shape{1, 2}).to(st::kFloat32);
  EXPECT_TRUE(all_close(fc(ones), {0, 65504.5}, 0, 0));
}

// A bfloat16 layer's large weights saturate to the largest float16 too (65504 has no bfloat16
// value: clamping in bfloat16 would round it up to 65536, an inf in float16), and a NaN weight stays
// NaN (fbgemm's saturation compares, which a NaN fails).
TEST(Float16DynamicLinear, SaturatesBFloat16WeightsAndKeepsNaN) {
  nn::Linear fc(2, 2, {.bias = false});
  {
    st::NoGradGuard no_grad;
    fc.weight.copy_(st::from_vector(std::vector<double>{1e6, -70000.0, 0.5, std::nan("")}, st::Shape{2, 2}));
  }
  fc.to(st::kBFloat16);
  q::quantize_dynamic(fc, {.dtype = q::WeightDtype::Float16});
  const std::vector<double> w = values(fc.state_dict().at("quantized.weight_fp16"));
  EXPECT_EQ(w[0], 65504);
  EXPECT_EQ(w[1], -65504);
  EXPECT_EQ(w[2], 0.5);
  EXPECT_TRUE(std::isnan(w[3]));
}
