// Static int8 quantization: conv2d_int8 and linear_int8_static against the integer math written
// out in the test (exact int32 accumulations, float64 references on dequantized values), a
// converted model against a simulation of its integer sums, float32 epilogues and quantize-
// dequantize steps (every output code equal), a small trained convolutional classifier's accuracy, and the errors.
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
using st::testing::throws_with;
using st::testing::values;

using st::testing::centered;
using st::testing::codes_of;
using st::testing::epilogue;

TEST(Conv2dInt8, AccumulationsAreExact) {
  st::manual_seed(5);
  const nn::functional::Conv2dArgs args{.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2};
  const st::Tensor x = st::randn({2, 4, 7, 6});
  const st::Tensor weight = st::randn({6, 2, 3, 3}), bias = st::randn({6});
  const q::Int8Weight w = q::quantize_weight_int8(weight.reshape({6, -1}));
  const double sx = 0.03;
  const int64_t zx = 121;
  const st::Tensor y = q::conv2d_int8(x, sx, zx, w, {3, 3}, args);
  const st::Tensor yb = q::conv2d_int8(x, sx, zx, w, {3, 3}, args, bias);
  // the int32 accumulations: a float64 convolution of the integer codes (zero padding = the zero point)
  const st::Tensor wq = w.codes.to(st::kFloat64).reshape({6, 2, 3, 3});
  const st::Tensor acc = F::conv2d(centered(codes_of(x, sx, zx), zx, x.shape()), wq, {}, args);
  ASSERT_EQ(y.shape(), acc.shape());
  const std::vector<double> a = values(acc), got = values(y), got_b = values(yb), ws = values(w.scale),
                            bv = values(bias);
  const int64_t per_channel = acc.size(2) * acc.size(3);
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t c = (i / per_channel) % 6;
    // the epilogue's float32 arithmetic on the exact sum: acc * (x_scale * w_scale) (+ bias)
    const float p = static_cast<float>(sx) * static_cast<float>(ws[c]);
    const float want = static_cast<float>(a[i]) * p;
    ASSERT_EQ(got[i], want) << i;
    ASSERT_EQ(got_b[i], static_cast<double>(want + static_cast<float>(bv[c]))) << i;
  }
  // against the float convolution of the dequantized values, in float64
  const st::Tensor xd = centered(codes_of(x, sx, zx), zx, x.shape()) * sx;
  const st::Tensor wd = wq * w.scale.to(st::kFloat64).reshape({6, 1, 1, 1});
  EXPECT_TRUE(all_close(yb, values(F::conv2d(xd, wd, bias.to(st::kFloat64), args)), 1e-5, 1e-5));
  // a channels-last input (quantized as it lies) gives the same values, channels last
  const st::Tensor ycl = q::conv2d_int8(x.to(st::MemoryFormat::ChannelsLast), sx, zx, w, {3, 3}, args);
  EXPECT_TRUE(ycl.is_contiguous(st::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(all_close(ycl, got, 0, 0));
  // an unbatched input gives the first image's result
  EXPECT_TRUE(all_close(q::conv2d_int8(x.narrow(0, 0, 1).squeeze(0), sx, zx, w, {3, 3}, args),
                        values(y.narrow(0, 0, 1)), 0, 0));
}

TEST(LinearInt8Static, AccumulationsAreExact) {
  st::manual_seed(6);
  const st::Tensor x = st::randn({5, 37}), weight = st::randn({9, 37});
  const q::Int8Weight w = q::quantize_weight_int8(weight);
  const double sx = 0.02;
  const int64_t zx = 130;
  const st::Tensor y = q::linear_int8_static(x, sx, zx, w);
  const st::Tensor acc = F::linear(centered(codes_of(x, sx, zx), zx, x.shape()), w.codes.to(st::kFloat64));
  const std::vector<double> a = values(acc), got = values(y), ws = values(w.scale);
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(got[i], static_cast<float>(a[i]) * (static_cast<float>(sx) * static_cast<float>(ws[i % 9]))) << i;
}

// A fused Conv-BN-ReLU, then a Linear: the converted model's output against each layer's integer math
// and float32 epilogue redone from the state dict, on the simulated quantize-dequantize values.
TEST(StaticQuant, ConvertedModelMatchesSimulatedIntegerMath) {
  st::manual_seed(7);
  nn::Sequential model(nn::Conv2d(3, 8, 3, {.padding = 1}), nn::BatchNorm2d(8), nn::ReLU(), nn::Flatten(),
                       nn::Linear(8 * 5 * 5, 4));
  {
    st::NoGradGuard no_grad;
    model.at<nn::BatchNorm2d>(1).running_var.copy_(st::rand({8}) + 0.5);
  }
  model.eval();
  q::fuse_modules(model, {{"0", "1", "2"}});
  EXPECT_EQ(q::prepare(model), 2);
  EXPECT_EQ(model[1].name(), "Identity");
  EXPECT_EQ(model.get_submodule("0.1").name(), "Identity");  // the ReLU moved into the form
  EXPECT_EQ(model.state_dict().count("0.0.observed.output_observer.min_val"), 1u);
  for (int i = 0; i < 4; ++i) model(st::randn({8, 3, 5, 5}));  // calibration
  const st::Tensor conv_w = model.get_submodule("0.0").state_dict().at("weight").clone();
  const st::Tensor conv_b = model.get_submodule("0.0").state_dict().at("bias").clone();
  const st::Tensor fc_b = model.at<nn::Linear>(4).bias.clone();
  EXPECT_EQ(q::convert(model), 2);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.count("0.0.weight"), 0u);
  const auto scalar = [&](const std::string& k) { return values(sd.at(k))[0]; };

  const st::Tensor x = st::randn({6, 3, 5, 5});
  const st::Tensor got = model(x);
  // layer 1: quantize the input, the integer convolution, bias, ReLU, requantize
  const double s1 = scalar("0.0.quantized.input_scale"), o1 = scalar("0.0.quantized.output_scale");
  const int64_t z1 = int64_t(scalar("0.0.quantized.input_zero_point"));
  const int64_t oz1 = int64_t(scalar("0.0.quantized.output_zero_point"));
  const st::Tensor w1 = sd.at("0.0.quantized.weight_int8").to(st::kFloat64).reshape({8, 3, 3, 3});
  const st::Tensor ws1 = sd.at("0.0.quantized.weight_scale").to(st::kFloat64);
  // the codes are the folded weight's, per channel symmetric: round(w / scale)
  const std::vector<double> cw = values(conv_w), codes1 = values(w1), sc1 = values(ws1);
  for (size_t i = 0; i < cw.size(); ++i) {
    const float inv = 1.0f / static_cast<float>(sc1[i / 27]);
    ASSERT_EQ(codes1[i], std::clamp(std::nearbyint(double(float(cw[i]) * inv)), -128.0, 127.0)) << i;
  }
  const st::Tensor acc1 = F::conv2d(centered(codes_of(x, s1, z1), z1, x.shape()), w1, {}, {.padding = 1});
  const st::Tensor y1 = F::relu(epilogue(acc1, s1, ws1, conv_b, 25));
  const st::Tensor h = centered(codes_of(y1, o1, oz1), oz1, y1.shape()) * o1;  // the requantized activations
  // layer 2 on the simulated activations
  const double s2 = scalar("4.quantized.input_scale"), o2 = scalar("4.quantized.output_scale");
  const int64_t z2 = int64_t(scalar("4.quantized.input_zero_point"));
  const int64_t oz2 = int64_t(scalar("4.quantized.output_zero_point"));
  const st::Tensor w2 = sd.at("4.quantized.weight_int8").to(st::kFloat64);
  const st::Tensor ws2 = sd.at("4.quantized.weight_scale").to(st::kFloat64);
  const st::Tensor hf = h.reshape({6, -1});
  const st::Tensor acc2 = F::linear(centered(codes_of(hf, s2, z2), z2, hf.shape()), w2);
  const st::Tensor y2 = epilogue(acc2, s2, ws2, fc_b, 1);
  const std::vector<double> want = values(centered(codes_of(y2, o2, oz2), oz2, y2.shape()) * o2);
  const std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size());
  // every output is the simulated one's code (the float32 dequantized value, within 1e-3 of a step)
  for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(std::abs(g[i] - want[i]), o2 * 1e-3) << i;
  // the state dict loads into another model converted the same way
  nn::Sequential twin(nn::Conv2d(3, 8, 3, {.padding = 1}), nn::BatchNorm2d(8), nn::ReLU(), nn::Flatten(),
                      nn::Linear(8 * 5 * 5, 4));
  twin.eval();
  q::fuse_modules(twin, {{"0", "1", "2"}});
  q::prepare(twin);
  twin(st::randn({2, 3, 5, 5}) * 3.0);
  q::convert(twin);
  twin.load_state_dict(sd);
  EXPECT_TRUE(all_close(twin(x), g, 0, 0));
}

// Two bars, horizontal or vertical, in noise: a small Conv-BN-ReLU classifier, trained in float,
// quantized statically, keeps its accuracy.
TEST(StaticQuant, TrainedClassifierKeepsItsAccuracy) {
  st::manual_seed(8);
  const int64_t n = 256;
  const auto make_data = [&](st::Tensor* images, st::Tensor* labels) {
    std::vector<float> img(static_cast<size_t>(n * 64));
    std::vector<int64_t> lab(static_cast<size_t>(n));
    const std::vector<double> noise = values(st::randn({n * 64}) * 0.5);
    const std::vector<double> pos = values(st::rand({n}) * 6.0);
    for (int64_t i = 0; i < n; ++i) {
      lab[size_t(i)] = i % 2;
      const int64_t p = 1 + int64_t(pos[size_t(i)]);
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t c = 0; c < 8; ++c) {
          const bool on = lab[size_t(i)] ? c == p : r == p;
          img[size_t(i * 64 + r * 8 + c)] = float(noise[size_t(i * 64 + r * 8 + c)]) + (on ? 1.5f : 0.0f);
        }
    }
    *images = st::from_vector(img).reshape({n, 1, 8, 8});
    *labels = st::from_vector(lab);
  };
  st::Tensor train_x, train_y, test_x, test_y;
  make_data(&train_x, &train_y);
  make_data(&test_x, &test_y);
  nn::Sequential model(nn::Conv2d(1, 8, 3, {.padding = 1}), nn::BatchNorm2d(8), nn::ReLU(),
                       nn::Conv2d(8, 8, 3, {.stride = 2, .padding = 1}), nn::ReLU(), nn::Flatten(),
                       nn::Linear(8 * 4 * 4, 2));
  st::optim::Adam opt(model.parameters(), {.lr = 0.01});
  for (int step = 0; step < 60; ++step) {
    st::Tensor loss = F::cross_entropy(model(train_x), train_y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  model.eval();
  const auto accuracy = [&](nn::Module& m) {
    st::NoGradGuard no_grad;
    const std::vector<double> pred = values(st::argmax(m(test_x), 1)), want = values(test_y);
    int ok = 0;
    for (size_t i = 0; i < pred.size(); ++i) ok += pred[i] == want[i];
    return double(ok) / double(pred.size());
  };
  const double float_acc = accuracy(model);
  const st::Tensor float_logits = model(test_x).detach();
  ASSERT_GE(float_acc, 0.9);
  q::fuse_modules(model, {{"0", "1", "2"}, {"3", "4"}});
  q::prepare(model);
  model(train_x);
  EXPECT_EQ(q::convert(model), 3);
  const double int8_acc = accuracy(model);
  EXPECT_GE(int8_acc, float_acc - 0.02) << float_acc << " -> " << int8_acc;
  const double spread = values(st::amax(st::abs(float_logits)))[0];
  EXPECT_TRUE(all_close(model(test_x), values(float_logits), 0, 0.1 * spread));
}

TEST(StaticQuant, BadInputRaises) {
  nn::Sequential model(nn::Conv2d(2, 3, 3), nn::ReLU(), nn::Flatten(), nn::Linear(3, 2));
  EXPECT_TRUE(throws_with([&] { q::convert(model); }, {"convert", "no layer", "prepare"}));
  q::prepare(model);
  EXPECT_TRUE(throws_with([&] { q::prepare(model); }, {"prepare", "already"}));
  EXPECT_TRUE(throws_with([&] { q::convert(model); }, {"convert", "seen no data", "calibration"}));
  model(st::randn({2, 2, 3, 3}));
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_TRUE(throws_with([&] { model(st::randn({2, 3, 3, 3})); }, {"Conv2d", "channels"}));

  nn::Sequential no_layers{nn::ReLU(), nn::Tanh()};
  EXPECT_TRUE(throws_with([&] { q::prepare(no_layers); }, {"prepare", "no nn::Linear, Conv2d, Conv1d or"}));
  nn::Sequential reflect(nn::Conv2d(2, 3, 3, {.padding = 1, .padding_mode = nn::PaddingMode::Reflect}));
  EXPECT_TRUE(throws_with([&] { q::prepare(reflect); }, {"pads other than with zeros"}));
  nn::Sequential qat_fused(nn::Conv2d(2, 3, 3), nn::BatchNorm2d(3));
  q::fuse_modules_qat(qat_fused, {{"0", "1"}});
  EXPECT_TRUE(throws_with([&] { q::prepare(qat_fused); }, {"ConvBn2d", "fuse_modules"}));
  nn::Sequential per_channel(nn::Linear(3, 2));
  EXPECT_TRUE(throws_with(
      [&] {
        q::prepare(per_channel, {.activation_observer = [] {
                     return std::make_unique<q::PerChannelMinMaxObserver>(q::per_channel_defaults());
                   }});
      },
      {"per tensor"}));

  const q::Int8Weight w = q::quantize_weight_int8(st::randn({4, 2 * 9}));
  EXPECT_TRUE(throws_with([&] { q::conv2d_int8(st::randn({1, 3, 5, 5}), 0.1, 0, w, {3, 3}); }, {"conv2d_int8",
                                                                                                  "do not fit"}));
  EXPECT_TRUE(throws_with([&] { q::conv2d_int8(st::randn({1, 2, 2, 2}), 0.1, 0, w, {3, 3}); }, {"smaller"}));
  EXPECT_TRUE(throws_with([&] { q::conv2d_int8(st::randn({1, 2, 5, 5}), 0.0, 0, w, {3, 3}); }, {"scale"}));
  EXPECT_TRUE(throws_with([&] { q::conv2d_int8(st::randn({1, 2, 5, 5}), 0.1, 300, w, {3, 3}); }, {"zero point"}));
  EXPECT_TRUE(throws_with([&] { q::linear_int8_static(st::randn({2, 5}), 0.1, 3, q::quantize_weight_int8(
                                                         st::randn({3, 4}))); }, {"linear_int8_static", "(*, 4)"}));
}

// prepare makes every form before it changes the model: a failing observer leaves the fused ReLU
// in place and no layer prepared.
TEST(StaticQuant, FailedPrepareLeavesTheModelUnchanged) {
  st::manual_seed(9);
  nn::Sequential model(nn::Conv2d(2, 3, 3), nn::ReLU(), nn::Flatten(), nn::Linear(3, 2));
  model.eval();
  q::fuse_modules(model, {{"0", "1"}});
  const st::Tensor x = st::randn({4, 2, 3, 3});
  const std::vector<double> want = values(model(x));
  const auto per_channel = [] { return std::make_unique<q::PerChannelMinMaxObserver>(q::per_channel_defaults()); };
  EXPECT_TRUE(throws_with([&] { q::prepare(model, {.activation_observer = per_channel}); }, {"per tensor"}));
  int made = 0;
  const auto third_fails = [&]() -> std::unique_ptr<q::Observer> {
    return ++made > 2 ? nullptr : std::make_unique<q::MinMaxObserver>();
  };
  EXPECT_TRUE(throws_with([&] { q::prepare(model, {.activation_observer = third_fails}); }, {"null"}));
  EXPECT_EQ(model.get_submodule("0.1").name(), "ReLU");
  EXPECT_EQ(model.get_submodule("0.0").named_children().size(), 0u);
  EXPECT_EQ(model.at<nn::Linear>(3).form(), nullptr);
  EXPECT_TRUE(all_close(model(x), want, 0, 0));
  EXPECT_EQ(q::prepare(model), 2);  // and it can be prepared afterwards
}
