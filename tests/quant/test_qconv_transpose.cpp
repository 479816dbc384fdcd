// Static int8 and QAT ConvTranspose2d: conv_transpose2d_int8 and the converted layer against the
// transposed convolution written out in float64 (each input pixel scattering over its taps) on the
// values quantized by PyTorch's formula (weights per output channel, symmetric), outputs
// requantized; QAT's forward and straight-through weight gradient; convert against the
// fake-quantized model; the state dict and the errors.
#include <cmath>
#include <cstdint>
#include <vector>

#include "quant/quant_reference.h"
#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::centered;
using st::testing::codes_of;
using st::testing::throws_with;
using st::testing::values;
using st::testing::weight_codes;

namespace {

// A transposed weight (in, out / groups, kH, kW) with its output channels on dim 0: (out, in / groups, kH, kW).
st::Tensor out_major(const st::Tensor& w, int64_t groups) {
  const int64_t in = w.size(0), out_g = w.size(1), kh = w.size(2), kw = w.size(3);
  return w.reshape({groups, in / groups, out_g, kh, kw}).permute({0, 2, 1, 3, 4}).reshape({groups * out_g,
                                                                                           in / groups, kh, kw});
}

// conv_transpose2d in float64 by its definition: x (N, C, H, W), w_om (out, C / groups, kH, kW) as out_major
// gives it, bias (out) or undefined; every input pixel adds x * w at each tap's output position.
st::Tensor transposed_ref(const st::Tensor& x, const st::Tensor& w_om, const st::Tensor& bias,
                          const F::ConvTranspose2dArgs& a) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), out = w_om.size(0);
  const int64_t G = a.groups, Cg = C / G, out_g = out / G, kh = w_om.size(2), kw = w_om.size(3);
  const int64_t OH = (H - 1) * a.stride.h - 2 * a.padding.h + a.dilation.h * (kh - 1) + a.output_padding.h + 1;
  const int64_t OW = (W - 1) * a.stride.w - 2 * a.padding.w + a.dilation.w * (kw - 1) + a.output_padding.w + 1;
  const std::vector<double> xv = values(x), wv = values(w_om);
  const std::vector<double> bv = bias.defined() ? values(bias) : std::vector<double>(size_t(out), 0.0);
  std::vector<double> y(size_t(N * out * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < OH * OW; ++i) y[size_t((n * out + o) * OH * OW + i)] = bv[size_t(o)];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t iy = 0; iy < H; ++iy)
        for (int64_t ix = 0; ix < W; ++ix) {
          const double v = xv[size_t(((n * C + c) * H + iy) * W + ix)];
          const int64_t g = c / Cg;
          for (int64_t j = 0; j < out_g; ++j)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t oy = iy * a.stride.h - a.padding.h + ky * a.dilation.h;
                const int64_t ox = ix * a.stride.w - a.padding.w + kx * a.dilation.w;
                if (oy < 0 || oy >= OH || ox < 0 || ox >= OW) continue;
                const int64_t o = g * out_g + j;
                const double wt = wv[size_t(((o * Cg + c % Cg) * kh + ky) * kw + kx)];
                y[size_t(((n * out + o) * OH + oy) * OW + ox)] += v * wt;
              }
        }
  return st::from_vector(y, st::Shape{N, out, OH, OW});
}

double scalar(const nn::StateDict& sd, const std::string& key) { return values(sd.at(key))[0]; }

// The dequantized values of x quantized with (scale, zero) to uint8 by the formula.
st::Tensor fake_quant(const st::Tensor& x, double scale, int64_t zero) {
  return centered(codes_of(x, scale, zero), zero, x.shape()) * scale;
}

}  // namespace

TEST(ConvTranspose2dInt8, MatchesTheFloat64TransposedConvolutionOfQuantizedValues) {
  st::manual_seed(41);
  const F::ConvTranspose2dArgs a{.stride = {2, 3}, .padding = {1, 2}, .output_padding = {1, 0}, .groups = 2,
                                 .dilation = {1, 2}};
  const st::Tensor x = st::randn({2, 4, 5, 4}), w = st::randn({4, 3, 3, 2}), bias = st::randn({6});
  const st::Tensor w_om = out_major(w, 2);
  const q::Int8Weight w8 = q::quantize_weight_int8(w_om.reshape({6, -1}));
  const auto [codes, scales] = weight_codes(w_om);
  ASSERT_TRUE(all_close(w8.codes, values(codes), 0, 0));
  const double sx = 0.025;
  const int64_t zx = 117;
  const st::Tensor y = q::conv_transpose2d_int8(x, sx, zx, w8, {3, 2}, a, bias);
  const st::Tensor want = transposed_ref(fake_quant(x, sx, zx), codes * scales.reshape({6, 1, 1, 1}), bias, a);
  ASSERT_EQ(y.shape(), want.shape());
  EXPECT_EQ(y.shape(), F::conv_transpose2d(x, w, bias, a).shape());
  EXPECT_TRUE(all_close(y, values(want), 1e-5, 1e-5));
  // near the float layer (within the quantization error), channels last, unbatched
  EXPECT_LT(st::testing::max_abs_diff(y, F::conv_transpose2d(x, w, bias, a)), 0.2);
  const st::Tensor ycl = q::conv_transpose2d_int8(x.to(st::MemoryFormat::ChannelsLast), sx, zx, w8, {3, 2}, a, bias);
  EXPECT_TRUE(ycl.is_contiguous(st::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(all_close(ycl, values(y), 0, 0));
  EXPECT_TRUE(all_close(q::conv_transpose2d_int8(x.narrow(0, 1, 1).squeeze(0), sx, zx, w8, {3, 2}, a, bias),
                        values(y.narrow(0, 1, 1)), 0, 0));
}

// prepare, calibrate, convert: each output is the requantized code of the float64 reference (a value
// within float32 rounding of a half step may take the neighbouring code).
TEST(StaticConvTranspose2d, ConvertedLayerMatchesTheReference) {
  st::manual_seed(42);
  const F::ConvTranspose2dArgs a{.stride = 2, .padding = 1, .output_padding = 1, .groups = 2};
  nn::Sequential model(nn::ConvTranspose2d(4, 6, 3, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2}));
  EXPECT_EQ(q::prepare(model), 1);
  for (int i = 0; i < 3; ++i) model(st::randn({4, 4, 5, 5}));
  const st::Tensor w = model.at<nn::ConvTranspose2d>(0).weight.clone(), bias = model.at<nn::ConvTranspose2d>(0).bias;
  EXPECT_EQ(q::convert(model), 1);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.count("0.weight"), 0u);
  EXPECT_EQ(sd.at("0.quantized.weight_int8").shape(), (st::Shape{6, 2 * 9}));
  const auto [codes, scales] = weight_codes(out_major(w, 2));
  EXPECT_TRUE(all_close(sd.at("0.quantized.weight_int8"), values(codes), 0, 0));
  EXPECT_TRUE(all_close(sd.at("0.quantized.weight_scale"), values(scales), 0, 0));
  const st::Tensor x = st::randn({3, 4, 5, 5});
  const st::Tensor got = model(x);
  const double si = scalar(sd, "0.quantized.input_scale"), so = scalar(sd, "0.quantized.output_scale");
  const auto zi = int64_t(scalar(sd, "0.quantized.input_zero_point"));
  const auto zo = int64_t(scalar(sd, "0.quantized.output_zero_point"));
  const st::Tensor y = transposed_ref(fake_quant(x, si, zi), codes * scales.reshape({6, 1, 1, 1}), bias, a);
  const std::vector<double> want = values(fake_quant(y, so, zo)), g = values(got);
  ASSERT_EQ(got.shape(), y.shape());
  size_t exact = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LE(std::abs(g[i] - want[i]), so * 1.001) << i;
    exact += std::abs(g[i] - want[i]) <= so * 1e-3 ? 1 : 0;
  }
  EXPECT_GE(double(exact), 0.99 * double(g.size()));
  // the state dict loads into another model converted the same way
  nn::Sequential twin(nn::ConvTranspose2d(4, 6, 3, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2}));
  q::prepare(twin);
  twin(st::randn({2, 4, 5, 5}) * 2.0);
  q::convert(twin);
  EXPECT_FALSE(all_close(twin(x), g, 0, 0));
  twin.load_state_dict(sd);
  EXPECT_TRUE(all_close(twin(x), g, 0, 0));
}

// QAT: the forward is the float64 transposed convolution of tensors fake-quantized by the formula,
// the weight per output channel (dim 1 of the weight); its gradient is the straight-through one.
TEST(QatConvTranspose2d, ForwardAndStraightThroughGradient) {
  st::manual_seed(43);
  const F::ConvTranspose2dArgs a{.stride = 2, .padding = 1, .output_padding = 1};
  nn::Sequential model(nn::ConvTranspose2d(3, 4, 3, {.stride = 2, .padding = 1, .output_padding = 1}));
  EXPECT_EQ(q::prepare_qat(model), 1);
  auto& layer = model.at<nn::ConvTranspose2d>(0);
  const st::Tensor x = st::randn({2, 3, 4, 5});
  const st::Tensor y = model(x);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.at("0.qat.weight_fake_quant.scale").shape(), st::Shape{4});
  const double sx = scalar(sd, "0.qat.input_fake_quant.scale");
  const auto zx = int64_t(scalar(sd, "0.qat.input_fake_quant.zero_point"));
  const auto [codes, scales] = weight_codes(out_major(layer.weight.detach(), 1));
  EXPECT_TRUE(all_close(sd.at("0.qat.weight_fake_quant.scale"), values(scales), 0, 0));
  const st::Tensor xq = fake_quant(x, sx, zx), bias = layer.bias.detach().to(st::kFloat64);
  EXPECT_TRUE(all_close(y, values(transposed_ref(xq, codes * scales.reshape({4, 1, 1, 1}), bias, a)), 1e-5, 1e-6));
  // the straight-through gradient: d(sum(y * g))/dw at the fake-quantized weight, where the code is in range
  const st::Tensor wq = out_major(codes * scales.reshape({4, 1, 1, 1}), 1).requires_grad_(true);  // back to (3, 4, ..)
  const st::Tensor g = st::randn(y.shape());
  (y * g).sum().backward();
  (F::conv_transpose2d(xq, wq, bias, a) * g.to(st::kFloat64)).sum().backward();
  const std::vector<double> wv = values(layer.weight), s = values(scales), dwq = values(wq.grad());
  std::vector<double> want(wv.size());
  int masked = 0;
  for (size_t i = 0; i < wv.size(); ++i) {
    const size_t o = (i / 9) % 4;  // (in, out, kH, kW)
    const double code = std::nearbyint(double(float(wv[i]) * (1.0f / float(s[o]))));
    const bool in = code >= -128 && code <= 127;
    masked += in ? 0 : 1;
    want[i] = in ? dwq[i] : 0.0;
  }
  EXPECT_GE(masked, 1);
  EXPECT_TRUE(all_close(layer.weight.grad(), want, 1e-5, 1e-6));
}

TEST(QatConvTranspose2d, TrainsAndConvertsToMatchingInt8) {
  st::manual_seed(44);
  const st::Tensor x = st::randn({8, 4, 4, 4});
  nn::ConvTranspose2d teacher(4, 2, 2, {.stride = 2});
  const st::Tensor target = teacher(x).detach();
  nn::Sequential model(nn::ConvTranspose2d(4, 6, 2, {.stride = 2, .groups = 2}), nn::ReLU(), nn::Conv2d(6, 2, 1));
  EXPECT_EQ(q::prepare_qat(model), 2);
  EXPECT_EQ(model.state_dict().at("0.qat.weight_fake_quant.scale").shape(), st::Shape{6});  // every output channel
  st::optim::Adam opt(model.parameters(), {.lr = 0.02});
  double first = 0, last = 0;
  for (int step = 0; step < 120; ++step) {
    st::Tensor loss = F::mse_loss(model(x), target);
    (step == 0 ? first : last) = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
  model.eval();
  q::disable_observer(model);
  const st::Tensor fake = model(x).detach();
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_EQ(model.state_dict().at("0.quantized.weight_int8").shape(), (st::Shape{6, 2 * 4}));
  // the same integers and scales: only the order of float sums differs
  EXPECT_TRUE(all_close(model(x), values(fake), 1e-4, 1e-4));
}

TEST(StaticConvTranspose2d, BadInputRaises) {
  nn::Sequential model(nn::ConvTranspose2d(2, 3, 3));
  q::prepare(model);
  EXPECT_TRUE(throws_with([&] { q::convert(model); }, {"convert", "seen no data"}));
  model(st::randn({2, 2, 4, 4}));
  q::convert(model);
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 3, 4, 4})); }, {"ConvTranspose2d", "channels"}));
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 4})); }, {"ConvTranspose2d", "shape"}));
  const q::Int8Weight w = q::quantize_weight_int8(st::randn({3, 2 * 9}));
  EXPECT_TRUE(throws_with([&] { q::conv_transpose2d_int8(st::randn({1, 3, 4, 4}), 0.1, 0, w, {3, 3}); },
                          {"conv_transpose2d_int8", "do not fit"}));
  EXPECT_TRUE(throws_with([&] { q::conv_transpose2d_int8(st::randn({1, 2, 4, 4}), 0.1, 0, w, {3, 3},
                                                         {.stride = 2, .output_padding = 2}); }, {"output_padding"}));
  EXPECT_TRUE(throws_with([&] { q::conv_transpose2d_int8(st::randn({1, 2, 1, 1}), 0.1, 0, w, {3, 3},
                                                         {.padding = 2}); }, {"empty"}));
  EXPECT_TRUE(throws_with([&] { q::conv_transpose2d_int8(st::randn({1, 2, 4, 4}), 0.1, 256, w, {3, 3}); },
                          {"zero point"}));
  // an input without rows or columns raises, as the float transposed convolution does (its output
  // would be the bias alone, spread over a size the formula gives from a height of 0)
  EXPECT_TRUE(throws_with([&] { q::conv_transpose2d_int8(st::randn({1, 2, 0, 4}), 0.1, 0, w, {3, 3}); },
                          {"conv_transpose2d_int8", "0 x 4"}));
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 2, 4, 0})); }, {"ConvTranspose2d", "4 x 0"}));
  // an empty batch gives an empty output of the right shape
  EXPECT_EQ(q::conv_transpose2d_int8(st::randn({0, 2, 4, 4}), 0.1, 3, w, {3, 3}).shape(), (st::Shape{0, 3, 6, 6}));
  EXPECT_EQ(model(st::randn({0, 2, 4, 4})).shape(), (st::Shape{0, 3, 6, 6}));
  nn::Sequential twice(nn::ConvTranspose2d(2, 3, 3));
  q::prepare_qat(twice);
  EXPECT_TRUE(throws_with([&] { q::prepare(twice); }, {"already"}));
}

// Eval fusion of ConvTranspose2d + BatchNorm2d folds the statistics along the output channels (dim 1
// of the weight); the folded layer then quantizes as any other.
TEST(FuseConvTranspose2d, FoldsBatchNormInEvalOnly) {
  st::manual_seed(45);
  nn::Sequential model(nn::ConvTranspose2d(4, 6, 3, {.stride = 2, .groups = 2}), nn::BatchNorm2d(6));
  {
    st::NoGradGuard no_grad;
    auto& bn = model.at<nn::BatchNorm2d>(1);
    bn.running_mean.copy_(st::randn({6}));
    bn.running_var.copy_(st::rand({6}) + 0.5);
    bn.weight.copy_(st::randn({6}));
    bn.bias.copy_(st::randn({6}));
  }
  model.eval();
  const st::Tensor x = st::randn({2, 4, 5, 5});
  const std::vector<double> want = values(model(x));
  q::fuse_modules(model, {{"0", "1"}});
  EXPECT_EQ(model[0].name(), "ConvTranspose2d");
  EXPECT_EQ(model[1].name(), "Identity");
  EXPECT_TRUE(all_close(model(x), want, 1e-5, 1e-5));
  q::prepare(model);
  model(x);
  q::convert(model);
  const double step = values(model.state_dict().at("0.quantized.output_scale"))[0];
  EXPECT_LT(st::testing::max_abs_diff(model(x), st::from_vector(want, st::Shape{2, 6, 11, 11})), 8 * step);

  nn::Sequential training(nn::ConvTranspose2d(4, 6, 3), nn::BatchNorm2d(6));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules_qat(training, {{"0", "1"}}); }, {"eval only"}));
}
