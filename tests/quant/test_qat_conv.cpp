// QAT of Conv2d: the fake-quantized forward against the float convolution of fake-quantized
// tensors computed in the test, training through the straight-through gradient, the converted
// int8 convolution against the fake-quantized model, and fused Conv-BN-ReLU QAT, which trains the
// folded weight's rounding (as PyTorch's ConvBnReLU2d) and which convert folds.
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::throws_with;
using st::testing::values;

TEST(QatConv2d, ForwardIsTheConvolutionOfFakeQuantizedTensors) {
  st::manual_seed(11);
  nn::Sequential model(nn::Conv2d(3, 4, 3, {.stride = 2, .padding = 1, .groups = 1}));
  EXPECT_EQ(q::prepare_qat(model), 1);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.at("0.qat.weight_fake_quant.scale").shape(), st::Shape{4});  // per output channel
  EXPECT_EQ(sd.count("0.qat.input_fake_quant.activation_post_process.min_val"), 1u);
  const st::Tensor x = st::randn({2, 3, 7, 7});
  const st::Tensor y = model(x);
  auto& conv = model.at<nn::Conv2d>(0);
  auto& fq_in = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.input_fake_quant"));
  auto& fq_w = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.weight_fake_quant"));
  // the fake quants' qparams after this batch: x's range, the weight's per channel symmetric range
  const double s = values(fq_in.scale)[0];
  const int64_t z = int64_t(values(fq_in.zero_point)[0]);
  const std::vector<double> ws = values(fq_w.scale), zw = values(fq_w.zero_point);
  for (double v : zw) EXPECT_EQ(v, 0.0);
  const st::Tensor xq = q::fake_quantize_per_tensor_affine(x, s, z, 0, 255);
  const st::Tensor wq = q::fake_quantize_per_channel_affine(conv.weight, fq_w.scale, fq_w.zero_point, 0, -128, 127);
  EXPECT_TRUE(all_close(y, values(F::conv2d(xq, wq, conv.bias, {.stride = 2, .padding = 1})), 1e-6, 1e-6));
  // gradients reach the float weight and the input
  st::Tensor xg = x.clone().requires_grad_(true);
  model(xg).sum().backward();
  EXPECT_TRUE(conv.weight.grad().defined() && xg.grad().defined());
}

TEST(QatConv2d, TrainsAndConvertsToMatchingInt8) {
  st::manual_seed(12);
  const st::Tensor x = st::randn({16, 2, 6, 6});
  nn::Conv2d teacher(2, 3, 3, {.padding = 1});
  const st::Tensor target = F::relu(teacher(x)).detach();
  nn::Sequential model(nn::Conv2d(2, 4, 3, {.padding = 1}), nn::ReLU(), nn::Conv2d(4, 3, 1));
  EXPECT_EQ(q::prepare_qat(model), 2);
  st::optim::Adam opt(model.parameters(), {.lr = 0.02});
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    st::Tensor loss = F::mse_loss(model(x), target);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.3 * first) << first << " -> " << last;
  model.eval();
  for (auto& [name, m] : model.named_modules())
    if (auto* fq = dynamic_cast<q::FakeQuantize*>(m)) fq->disable_observer();
  const st::Tensor fake = model(x).detach();
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_EQ(model.state_dict().at("0.quantized.weight_int8").shape(), (st::Shape{4, 2 * 9}));
  // the same integers and scales: only the order of float sums differs
  EXPECT_TRUE(all_close(model(x), values(fake), 1e-4, 1e-4));
}

// Conv-BN-ReLU QAT folds the batch norm into the weight the fake quant sees, as PyTorch's
// ConvBnReLU2d: in eval, the fake-quantized model is relu(conv(fq(x), fq(w * s)) + folded bias),
// s = gamma / sqrt(running_var + eps), and convert's int8 model computes the same integers.
TEST(QatConv2d, FusedConvBatchNormReluFoldsTheWeightItQuantizes) {
  st::manual_seed(13);
  const st::Tensor x = st::randn({16, 2, 6, 6});
  nn::Sequential model(nn::Conv2d(2, 4, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(4), nn::ReLU(),
                       nn::Conv2d(4, 2, 3));
  q::fuse_modules_qat(model, {{"0", "1", "2"}});
  EXPECT_EQ(q::prepare_qat(model), 2);
  st::optim::SGD opt(model.parameters(), {.lr = 0.05});
  for (int step = 0; step < 30; ++step) {
    st::Tensor loss = F::mse_loss(model(x), st::zeros({16, 2, 4, 4}) + 0.5);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  auto& fused = model.at<q::FusedModule>(0);
  EXPECT_TRUE(fused.at<nn::BatchNorm2d>(1).weight.grad().defined());  // gamma trains through the scale too
  model.eval();
  model(x);  // observe once in eval, then freeze
  for (auto& [name, m] : model.named_modules())
    if (auto* fq = dynamic_cast<q::FakeQuantize*>(m)) fq->disable_observer();
  // the first block by hand
  auto& conv = fused.at<nn::Conv2d>(0);
  auto& bn = fused.at<nn::BatchNorm2d>(1);
  auto& fq_in = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.input_fake_quant"));
  auto& fq_w = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.weight_fake_quant"));
  st::NoGradGuard no_grad;
  const st::Tensor s = bn.weight / st::sqrt(bn.running_var + bn.options.eps);
  const st::Tensor wq = q::fake_quantize_per_channel_affine(conv.weight * s.reshape({4, 1, 1, 1}), fq_w.scale,
                                                            fq_w.zero_point, 0, -128, 127);
  const st::Tensor xq = q::fake_quantize_per_tensor_affine(x, values(fq_in.scale)[0],
                                                           int64_t(values(fq_in.zero_point)[0]), 0, 255);
  const st::Tensor want_block = F::relu(F::conv2d(xq, wq, bn.bias - bn.running_mean * s, {.padding = 1}));
  EXPECT_TRUE(all_close(fused(x), values(want_block), 1e-5, 1e-5));
  const st::Tensor fake = model(x).detach();
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_EQ(fused[0].name(), "Conv2d");
  EXPECT_EQ(fused[1].name(), "Identity");  // folded
  EXPECT_EQ(fused[2].name(), "ReLU");
  EXPECT_EQ(model.state_dict().count("0.0.quantized.weight_int8") + model.state_dict().count("0.0.bias"), 2u);
  // the same integers and scales: only the order of float sums differs
  EXPECT_TRUE(all_close(model(x), values(fake), 1e-4, 1e-4));
  // the converted state dict loads into another model fused, prepared and converted the same way
  nn::Sequential twin(nn::Conv2d(2, 4, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(4), nn::ReLU(),
                      nn::Conv2d(4, 2, 3));
  q::fuse_modules_qat(twin, {{"0", "1", "2"}});
  q::prepare_qat(twin);
  q::convert(twin);
  twin.load_state_dict(model.state_dict());
  EXPECT_TRUE(all_close(twin(x), values(model(x)), 0, 0));
  nn::Sequential fresh(nn::Conv2d(2, 4, 3), nn::Conv2d(4, 4, 1));
  EXPECT_TRUE(throws_with([&] { q::convert(fresh); }, {"no layer"}));
  // a factory failing on the second layer leaves the first one unprepared too
  int made = 0;
  const auto second_fails = [&](int64_t out) { return ++made > 1 ? nullptr : q::default_weight_fake_quant(out); };
  EXPECT_TRUE(throws_with([&] { q::prepare_qat(fresh, {.weight_fake_quant = second_fails}); }, {"null"}));
  EXPECT_EQ(fresh.at<nn::Conv2d>(0).form(), nullptr);
}
