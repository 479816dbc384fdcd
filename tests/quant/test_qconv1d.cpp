// Static int8 and QAT Conv1d (a Conv2d of height 1 underneath): the converted layer against its
// integer math redone in the test (PyTorch's quantize formula, exact int32 sums by a float64
// convolution of the codes, the float32 epilogue, requantization), QAT's forward against the float64
// convolution of tensors fake-quantized by the formula, its straight-through weight gradient
// against the one written out, convert against the fake-quantized model, Conv1d + BatchNorm1d (+
// ReLU) fusion, the state dict and the errors.
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
using st::testing::epilogue;
using st::testing::throws_with;
using st::testing::weight_codes;
using st::testing::values;

namespace {

double scalar(const nn::StateDict& sd, const std::string& key) { return values(sd.at(key))[0]; }

}  // namespace

// Conv1d (groups 2, stride 2, padding 2, dilation 2) + ReLU fused, then a plain Conv1d: each output
// is the code the integer math simulated in the test gives.
TEST(StaticConv1d, ConvertedModelMatchesSimulatedIntegerMath) {
  st::manual_seed(31);
  const F::Conv1dArgs a1{.stride = 2, .padding = 2, .dilation = 2, .groups = 2};
  nn::Sequential model(nn::Conv1d(4, 6, 3, {.stride = 2, .padding = 2, .dilation = 2, .groups = 2}), nn::ReLU(),
                       nn::Conv1d(6, 3, 2));
  model.eval();
  q::fuse_modules(model, {{"0", "1"}});
  EXPECT_EQ(model[0].name(), "ConvReLU1d");
  EXPECT_EQ(q::prepare(model), 2);
  for (int i = 0; i < 3; ++i) model(st::randn({4, 4, 17}));
  const st::Tensor w1f = model.get_submodule("0.0").state_dict().at("weight").clone();
  const st::Tensor b1 = model.get_submodule("0.0").state_dict().at("bias").clone();
  const st::Tensor b2 = model.at<nn::Conv1d>(2).bias.clone();
  EXPECT_EQ(q::convert(model), 2);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.at("0.0.quantized.weight_int8").shape(), (st::Shape{6, 2 * 3}));
  EXPECT_EQ(sd.count("0.0.weight"), 0u);
  // the weight codes and scales are the formula's
  const auto [c1, s1w] = weight_codes(w1f);
  EXPECT_TRUE(all_close(sd.at("0.0.quantized.weight_int8"), values(c1), 0, 0));
  EXPECT_TRUE(all_close(sd.at("0.0.quantized.weight_scale"), values(s1w), 0, 0));

  const st::Tensor x = st::randn({3, 4, 17});
  const st::Tensor got = model(x);
  const double s1 = scalar(sd, "0.0.quantized.input_scale"), o1 = scalar(sd, "0.0.quantized.output_scale");
  const auto z1 = int64_t(scalar(sd, "0.0.quantized.input_zero_point"));
  const auto oz1 = int64_t(scalar(sd, "0.0.quantized.output_zero_point"));
  const st::Tensor acc1 = F::conv1d(centered(codes_of(x, s1, z1), z1, x.shape()), c1, {}, a1);
  const st::Tensor y1 = F::relu(epilogue(acc1, s1, s1w, b1, acc1.size(2)));
  const st::Tensor h = centered(codes_of(y1, o1, oz1), oz1, y1.shape()) * o1;
  const double s2 = scalar(sd, "2.quantized.input_scale"), o2 = scalar(sd, "2.quantized.output_scale");
  const auto z2 = int64_t(scalar(sd, "2.quantized.input_zero_point"));
  const auto oz2 = int64_t(scalar(sd, "2.quantized.output_zero_point"));
  const st::Tensor c2 = sd.at("2.quantized.weight_int8").to(st::kFloat64).reshape({3, 6, 2});
  const st::Tensor acc2 = F::conv1d(centered(codes_of(h, s2, z2), z2, h.shape()), c2);
  const st::Tensor y2 = epilogue(acc2, s2, sd.at("2.quantized.weight_scale"), b2, acc2.size(2));
  const std::vector<double> want = values(centered(codes_of(y2, o2, oz2), oz2, y2.shape()) * o2);
  const std::vector<double> g = values(got);
  ASSERT_EQ(got.shape(), y2.shape());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(std::abs(g[i] - want[i]), o2 * 1e-3) << i;
  // the im2col reference path gives the same bits as oneDNN's int8 convolution
  q::set_onednn_int8_conv(false);
  const st::Tensor by_im2col = model(x);
  q::set_onednn_int8_conv(true);
  EXPECT_TRUE(all_close(by_im2col, g, 0, 0));
  // an unbatched input gives the first sequence's result; a (N, L, C) sequence transposed, the same
  EXPECT_TRUE(all_close(model(x.narrow(0, 0, 1).squeeze(0)), values(got.narrow(0, 0, 1)), 0, 0));
  const st::Tensor x_nlc = x.permute({0, 2, 1}).contiguous().permute({0, 2, 1});
  const st::Tensor y_nlc = model(x_nlc);
  EXPECT_TRUE(all_close(y_nlc, g, 0, 0));
  EXPECT_EQ(y_nlc.strides()[1], 1);  // laid out as the input, as the float Conv1d's result
  // the state dict loads into another model converted the same way
  nn::Sequential twin(nn::Conv1d(4, 6, 3, {.stride = 2, .padding = 2, .dilation = 2, .groups = 2}), nn::ReLU(),
                      nn::Conv1d(6, 3, 2));
  twin.eval();
  q::fuse_modules(twin, {{"0", "1"}});
  q::prepare(twin);
  twin(st::randn({2, 4, 17}) * 3.0);
  q::convert(twin);
  EXPECT_FALSE(all_close(twin(x), g, 0, 0));
  twin.load_state_dict(sd);
  EXPECT_TRUE(all_close(twin(x), g, 0, 0));
}

// QAT: the forward is the float64 convolution of the tensors fake-quantized by the formula; the
// weight's gradient is the straight-through one: the gradient at the fake-quantized weight where its
// code lies in [-128, 127] before clamping, 0 elsewhere (the largest |w| of a channel rounds to 128).
TEST(QatConv1d, ForwardAndStraightThroughGradient) {
  st::manual_seed(32);
  nn::Sequential model(nn::Conv1d(3, 4, 3, {.stride = 2, .padding = 1}));
  EXPECT_EQ(q::prepare_qat(model), 1);
  auto& conv = model.at<nn::Conv1d>(0);
  const st::Tensor x = st::randn({2, 3, 11}).requires_grad_(true);
  const st::Tensor y = model(x);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.at("0.qat.weight_fake_quant.scale").shape(), st::Shape{4});
  const double sx = scalar(sd, "0.qat.input_fake_quant.scale");
  const auto zx = int64_t(scalar(sd, "0.qat.input_fake_quant.zero_point"));
  const auto [wc, ws] = weight_codes(conv.weight.detach());
  EXPECT_TRUE(all_close(sd.at("0.qat.weight_fake_quant.scale"), values(ws), 0, 0));
  const st::Tensor xq = centered(codes_of(x.detach(), sx, zx), zx, x.shape()) * sx;
  const st::Tensor wq = (wc * ws.reshape({4, 1, 1})).requires_grad_(true);
  const st::Tensor want = F::conv1d(xq, wq, conv.bias.detach().to(st::kFloat64), {.stride = 2, .padding = 1});
  EXPECT_TRUE(all_close(y, values(want), 1e-5, 1e-6));
  const st::Tensor g = st::randn(y.shape());
  (y * g).sum().backward();
  (want * g.to(st::kFloat64)).sum().backward();
  // the mask: round(w / scale) within [-128, 127]
  const std::vector<double> w = values(conv.weight), s = values(ws), dwq = values(wq.grad());
  std::vector<double> want_grad(w.size());
  int masked = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double code = std::nearbyint(double(float(w[i]) * (1.0f / float(s[i / 9]))));
    const bool in = code >= -128 && code <= 127;
    masked += in ? 0 : 1;
    want_grad[i] = in ? dwq[i] : 0.0;
  }
  EXPECT_GE(masked, 1);
  EXPECT_TRUE(all_close(conv.weight.grad(), want_grad, 1e-5, 1e-6));
  EXPECT_TRUE(x.grad().defined());
}

// QAT with Conv1d + BatchNorm1d + ReLU (fuse_modules_qat) trains, and convert's int8 model gives the
// fake-quantized model's outputs (the same integers; the float sums' order differs).
TEST(QatConv1d, FusedConvBatchNormTrainsAndConverts) {
  st::manual_seed(33);
  const st::Tensor x = st::randn({16, 2, 12});
  nn::Conv1d teacher(2, 3, 3, {.padding = 1});
  const st::Tensor target = teacher(x).detach();
  nn::Sequential model(nn::Conv1d(2, 6, 3, {.padding = 1, .bias = false}), nn::BatchNorm1d(6), nn::ReLU(),
                       nn::Conv1d(6, 3, 1));
  q::fuse_modules_qat(model, {{"0", "1", "2"}});
  EXPECT_EQ(model[0].name(), "ConvBnReLU1d");
  EXPECT_EQ(q::prepare_qat(model), 2);
  st::optim::Adam opt(model.parameters(), {.lr = 0.02});
  double first = 0, last = 0;
  for (int step = 0; step < 120; ++step) {
    st::Tensor loss = F::mse_loss(model(x), target);
    (step == 0 ? first : last) = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.3 * first) << first << " -> " << last;
  EXPECT_TRUE(model.get_submodule("0.1").parameters()[0].grad().defined());  // gamma trains through the folding
  model.eval();
  q::disable_observer(model);
  const st::Tensor fake = model(x).detach();
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_EQ(model.get_submodule("0.1").name(), "Identity");  // folded
  EXPECT_TRUE(all_close(model(x), values(fake), 1e-4, 1e-4));
}

// Eval fusion of Conv1d + BatchNorm1d folds the running statistics: the fused layer computes what the
// two did.
TEST(FuseConv1d, FoldsBatchNormInEval) {
  st::manual_seed(34);
  nn::Sequential model(nn::Conv1d(3, 5, 3), nn::BatchNorm1d(5));
  {
    st::NoGradGuard no_grad;
    auto& bn = model.at<nn::BatchNorm1d>(1);
    bn.running_mean.copy_(st::randn({5}));
    bn.running_var.copy_(st::rand({5}) + 0.5);
    bn.weight.copy_(st::randn({5}));
  }
  model.eval();
  const st::Tensor x = st::randn({2, 3, 9});
  const std::vector<double> want = values(model(x));
  q::fuse_modules(model, {{"0", "1"}});
  EXPECT_EQ(model[0].name(), "Conv1d");
  EXPECT_EQ(model[1].name(), "Identity");
  EXPECT_TRUE(all_close(model(x), want, 1e-5, 1e-5));
}

TEST(StaticConv1d, BadInputRaises) {
  nn::Sequential model(nn::Conv1d(2, 3, 3));
  q::prepare(model);
  EXPECT_TRUE(throws_with([&] { q::convert(model); }, {"convert", "seen no data"}));
  model(st::randn({2, 2, 8}));
  q::convert(model);
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 3, 8})); }, {"Conv1d", "channels"}));
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 2, 4, 8})); }, {"Conv1d", "shape"}));
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 2, 2})); }, {"smaller than the kernel"}));
  EXPECT_TRUE(throws_with([&] { q::prepare(model); }, {"already"}));
  EXPECT_EQ(model(st::randn({0, 2, 8})).shape(), (st::Shape{0, 3, 6}));  // an empty batch
  nn::Sequential circular(nn::Conv1d(2, 3, 3, {.padding = 1, .padding_mode = nn::PaddingMode::Circular}));
  EXPECT_TRUE(throws_with([&] { q::prepare_qat(circular); }, {"Conv1d", "pads other than with zeros"}));
  nn::Sequential mismatch(nn::Conv1d(2, 3, 3), nn::BatchNorm1d(4));
  mismatch.eval();
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(mismatch, {{"0", "1"}}); }, {"4 features", "3 output channels"}));
  nn::Sequential wrong_bn(nn::Conv1d(2, 3, 3), nn::BatchNorm2d(3));
  wrong_bn.eval();
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(wrong_bn, {{"0", "1"}}); }, {"cannot fuse", "Conv1d + BatchNorm1d"}));
}
