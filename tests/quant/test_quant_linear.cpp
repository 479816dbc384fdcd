// Quantized Linear layers: the dynamic int8 product within the error bound its scales allow,
// quantize_dynamic over a module tree (int8 and int4, filters), the quantized state dict through
// load_state_dict and safetensors, and the errors.
#include <algorithm>
#include <cmath>
#include <vector>

#include "temp_dir.h"
#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::max_abs_diff;
using st::testing::throws_with;
using st::testing::values;

namespace {

struct Net : st::nn::Module {
  st::nn::Linear fc1{32, 64}, fc2{64, 10};
  Net() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  st::Tensor forward(const st::Tensor& x) override { return fc2(st::relu(fc1(x))); }
};

}  // namespace

TEST(QuantLinear, Int8DynamicWithinTheBoundOfItsScales) {
  st::manual_seed(10);
  const int64_t M = 9, K = 77, N = 13;
  const st::Tensor x = st::randn({M, K}) * 2.0 + 0.5, w = st::randn({N, K}) * 0.2, b = st::randn({N});
  const q::Int8Weight qw = q::quantize_weight_int8(w);
  const st::Tensor y = q::linear_int8_dynamic(x, qw, b);
  const std::vector<double> xv = values(x), wv = values(w), bv = values(b), yv = values(y);
  for (int64_t n = 0; n < N; ++n) {
    double amax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(wv[n * K + k]));
    const double ew = amax / 127.5 / 2;  // symmetric weights: half a step
    for (int64_t m = 0; m < M; ++m) {
      double lo = 0, hi = 0, ref = bv[n], bound = 0;
      for (int64_t k = 0; k < K; ++k) lo = std::min(lo, xv[m * K + k]), hi = std::max(hi, xv[m * K + k]);
      const double ex = (hi - lo) / 255;  // affine rows: a step (rounding, plus the zero point's at the ends)
      for (int64_t k = 0; k < K; ++k) {
        ref += xv[m * K + k] * wv[n * K + k];
        bound += std::fabs(xv[m * K + k]) * ew + std::fabs(wv[n * K + k]) * ex + ex * ew;
      }
      EXPECT_LE(std::fabs(yv[m * N + n] - ref), bound + 1e-4) << m << "," << n;
      EXPECT_GT(bound, 0);
    }
  }
  // a row holding NaN or inf comes out NaN, the others are untouched
  st::Tensor bad = x.clone();
  bad.select(0, 2).select(0, 5).fill_(std::numeric_limits<float>::infinity());
  const std::vector<double> yb = values(q::linear_int8_dynamic(bad, qw, b));
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_TRUE(std::isnan(yb[2 * N + n]));
    EXPECT_EQ(yb[n], yv[n]);
  }
}

TEST(QuantLinear, Int8IntegerSumsAreExact) {
  // rows of integers spanning [0, 255] quantize to themselves (scale 1, zero point 0), so the
  // layer is sw[n] * sum_k x[m, k] * qw[n, k] + b[n] with exact integer sums; a wrong sum would be
  // off by a whole weight step. Odd K exercise the vector blocks and their tails.
  st::manual_seed(15);
  for (int64_t K : {7, 77, 300}) {
    const int64_t M = 6, N = 9;
    st::Tensor x = st::randint(0, 256, {M, K}).to(st::kFloat32);
    x.select(1, 0).fill_(0.0);
    x.select(1, K - 1).fill_(255.0);
    const st::Tensor w = st::randn({N, K}), b = st::randn({N});
    const q::Int8Weight qw = q::quantize_weight_int8(w);
    const std::vector<double> xv = values(x), cv = values(qw.codes), sv = values(qw.scale), bv = values(b);
    std::vector<double> want(M * N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += xv[m * K + k] * cv[n * K + k];
        want[m * N + n] = sv[n] * sum + bv[n];
      }
    EXPECT_TRUE(st::testing::all_close(q::linear_int8_dynamic(x, qw, b), want, 1e-6, 1e-5)) << "K = " << K;
  }
}

TEST(QuantLinear, QuantizeDynamicConvertsMemberLayers) {
  st::manual_seed(11);
  Net model, reference;
  reference.load_state_dict(model.state_dict());
  const st::Tensor x = st::randn({6, 32});
  const st::Tensor want = reference(x);
  EXPECT_EQ(q::quantize_dynamic(model), 2);
  EXPECT_FALSE(model.fc1.weight.defined());  // the float weight is dropped
  const st::nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.count("fc1.weight"), 0u);
  ASSERT_EQ(sd.count("fc1.quantized.weight_int8"), 1u);
  EXPECT_EQ(sd.at("fc1.quantized.weight_int8").dtype(), st::kInt8);
  EXPECT_EQ(sd.at("fc1.quantized.weight_int8").shape(), (st::Shape{64, 32}));
  EXPECT_EQ(sd.at("fc2.quantized.weight_scale").shape(), (st::Shape{10}));
  EXPECT_EQ(model.parameters().size(), 2u);  // the biases
  const st::Tensor got = model(x);
  EXPECT_FALSE(got.requires_grad());
  EXPECT_LT(max_abs_diff(got, want), 0.02 * st::amax(st::abs(want)).item<double>() + 1e-3);

  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(model); }, {"quantize_dynamic", "fc1", "already"}));
  EXPECT_TRUE(throws_with([&] { model(st::ones({2, 32}, st::kInt64)); }, {"floating"}));
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 31})); }, {"in_features=32"}));
  EXPECT_TRUE(throws_with([&] { model.fc1.reset_parameters(); }, {"replaced"}));
}

TEST(QuantLinear, StateDictRoundTripsThroughLoadAndSafetensors) {
  for (q::QuantizeOptions opts : {q::QuantizeOptions{}, q::QuantizeOptions{.dtype = q::WeightDtype::Int4,
                                                                           .group_size = 32, .symmetric = false}}) {
    st::manual_seed(12);
    Net a;
    st::manual_seed(13);
    Net b, c;
    for (Net* m : {&a, &b, &c}) q::quantize_dynamic(*m, opts);
    const st::Tensor x = st::randn({4, 32});
    const st::Tensor want = a(x);
    ASSERT_GT(max_abs_diff(b(x), want), 1e-3);  // different weights before loading
    b.load_state_dict(a.state_dict());
    EXPECT_EQ(max_abs_diff(b(x), want), 0.0);  // derived data (row sums) follows the loaded codes

    st::testing::TempDir dir;
    st::io::save_safetensors(dir / "q.safetensors", a.state_dict());
    st::io::SafetensorsFile file = st::io::load_safetensors(dir / "q.safetensors");
    c.load_state_dict(file.tensors);
    EXPECT_EQ(max_abs_diff(c(x), want), 0.0);

    Net plain;  // a float model refuses the quantized dict, naming the keys
    EXPECT_TRUE(throws_with([&] { plain.load_state_dict(a.state_dict()); }, {"fc1.weight", "fc1.quantized"}));
  }
}

TEST(QuantLinear, Int4LayersMatchTheFunctionalFormAndFilterSelects) {
  st::manual_seed(14);
  Net model, reference;
  reference.load_state_dict(model.state_dict());
  const int64_t n = q::quantize_dynamic(
      model, {.dtype = q::WeightDtype::Int4, .group_size = 32,
              .filter = [](const std::string& name, const st::nn::Linear&) { return name == "fc2"; }});
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(model.fc1.weight.defined());
  EXPECT_FALSE(model.fc2.weight.defined());
  EXPECT_EQ(model.state_dict().count("fc2.quantized.weight_int4"), 1u);
  EXPECT_EQ(model.state_dict().count("fc2.quantized.weight_zero_point"), 0u);  // symmetric
  const st::Tensor x = st::randn({5, 32});
  const st::Tensor h = st::relu(reference.fc1(x));
  const st::Tensor want = q::linear_int4(h, q::quantize_weight_int4(reference.fc2.weight, 32), reference.fc2.bias);
  EXPECT_EQ(max_abs_diff(model(x), want), 0.0);
  EXPECT_LT(max_abs_diff(model(x), reference(x)), 0.1 * st::amax(st::abs(reference(x))).item<double>());
  // bfloat16 activations through the int4 layer
  const st::Tensor yb = model.fc2(h.to(st::kBFloat16));
  EXPECT_EQ(yb.dtype(), st::kBFloat16);
  EXPECT_LT(max_abs_diff(yb, want), 0.05 * st::amax(st::abs(want)).item<double>());

  st::nn::Linear odd(48, 8);
  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(odd, {.dtype = q::WeightDtype::Int4, .group_size = 32}); },
                          {"group_size 32", "in_features 48"}));
  EXPECT_TRUE(odd.weight.defined());  // nothing converted
}

TEST(QuantLinear, KernelsRunThroughTheRegistrySoTheProfilerSeesThem) {
  st::manual_seed(3);
  st::nn::Linear i8(64, 16), i4(64, 16);
  q::quantize_dynamic(i8);
  q::quantize_dynamic(i4, {.dtype = q::WeightDtype::Int4, .group_size = 32});
  const st::Tensor x = st::randn({4, 64});
  st::profiler::Profiler session;
  session.start();
  i8(x);
  i4(x);
  session.stop();
  std::vector<std::string> names;
  for (const auto& e : session.events()) names.push_back(e.name);
  for (const char* op : {"quant_quantize_rows_uint8", "quant_int8_linear", "quant_int4_linear"})
    EXPECT_NE(std::find(names.begin(), names.end(), op), names.end()) << op;
}

TEST(QuantLinear, AttentionRunsWithAQuantizedOutProjection) {
  // out_proj's weight is undefined once its form replaces it: attention reads its width from
  // in_features, and the int8 output stays within int8's error of the float one
  st::manual_seed(12);
  st::nn::MultiheadAttention attn(16, 4);
  const st::Tensor x = st::randn({5, 2, 16});
  const st::Tensor expected = attn(x);
  q::quantize_dynamic(attn);
  ASSERT_FALSE(attn.out_proj.weight.defined());
  const st::Tensor got = attn(x);
  ASSERT_EQ(got.shape(), expected.shape());
  double scale = 0;
  for (double v : values(expected)) scale = std::max(scale, std::fabs(v));
  EXPECT_GT(max_abs_diff(got, expected), 0.0);
  EXPECT_LT(max_abs_diff(got, expected), 0.05 * scale);
}
