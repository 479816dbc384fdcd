// Quantization-aware training: fake quantization against its formula and the straight-through
// gradient, finite differences, the observers' running ranges, FakeQuantize's switches, and QAT
// of a small regression whose converted int8 model matches the fake-quantized one.
#include <cmath>
#include <limits>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::throws_with;
using st::testing::values;

namespace {

double round_half_even(double v) {
  const double f = std::floor(v), frac = v - f;
  if (frac != 0.5) return frac < 0.5 ? f : f + 1;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

}  // namespace

TEST(FakeQuantize, ForwardAndStraightThroughGradient) {
  const double scale = 0.125;  // a power of two: float32 and float64 codes agree exactly
  const int zp = 3, qmin = -8, qmax = 7;
  std::vector<float> xs;
  for (int i = -100; i <= 100; ++i) xs.push_back(float(i) * 0.0625f / 3.0f * 2.0f);  // crosses both clamps
  xs.push_back(0.0625f);   // a tie: 0.5 -> 0
  xs.push_back(0.1875f);   // 1.5 -> 2
  xs.push_back(0.5f);      // zp + 4 = 7: qmax, inside
  xs.push_back(0.5625f);   // zp + round(4.5) = 7: inside (tie to even)
  xs.push_back(0.625f);    // 8: outside
  for (st::DType dt : {st::kFloat32, st::kFloat64}) {
    st::Tensor x = st::from_vector(xs).to(dt).requires_grad_(true);
    st::Tensor y = q::fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax);
    ASSERT_EQ(y.dtype(), dt);
    st::Tensor g = st::randn({int64_t(xs.size())}).to(dt);
    (y * g).sum().backward();
    const std::vector<double> yv = values(y), gx = values(x.grad()), gv = values(g);
    for (size_t i = 0; i < xs.size(); ++i) {
      const double code = zp + round_half_even(xs[i] / scale);
      const double want = (std::clamp(code, double(qmin), double(qmax)) - zp) * scale;
      EXPECT_EQ(yv[i], want) << xs[i];
      EXPECT_EQ(gx[i], code >= qmin && code <= qmax ? gv[i] : 0.0) << xs[i];
    }
  }
  // per channel along dim 1
  st::manual_seed(20);
  st::Tensor x = (st::randn({3, 4}) * 2.0).requires_grad_(true);
  const st::Tensor s = st::tensor({0.25f, 0.5f, 0.125f, 1.0f}), z = st::tensor({0, -2, 2, 1}, st::kInt32);
  st::Tensor y = q::fake_quantize_per_channel_affine(x, s, z, 1, -4, 3);
  y.sum().backward();
  const std::vector<double> xv = values(x), yv = values(y), gx = values(x.grad());
  const double sv[] = {0.25, 0.5, 0.125, 1.0};
  const int zv[] = {0, -2, 2, 1};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = int(i % 4);
    const double code = zv[c] + round_half_even(float(xv[i]) * float(1 / sv[c]));
    EXPECT_EQ(yv[i], (std::clamp(code, -4.0, 3.0) - zv[c]) * sv[c]) << i;
    EXPECT_EQ(gx[i], code >= -4 && code <= 3 ? 1.0 : 0.0) << i;
  }
}

TEST(FakeQuantize, FiniteDifferences) {
  // Away from rounding boundaries fake quant is flat: a central difference across many steps
  // measures its average slope, which the straight-through gradient (1 inside, 0 outside) is.
  const double scale = 0.01, h = 0.2;  // h = 20 steps: |slope - 1| <= scale / h
  const auto f = [&](double v) {
    return q::fake_quantize_per_tensor_affine(st::scalar_tensor(v, st::kFloat64), scale, 0, -128, 127).item<double>();
  };
  for (double x0 : {-0.6, -0.013, 0.2, 0.77}) {  // inside [-1.28, 1.27]
    st::Tensor x = st::scalar_tensor(x0, st::kFloat64).requires_grad_(true);
    q::fake_quantize_per_tensor_affine(x, scale, 0, -128, 127).backward();
    const double fd = (f(x0 + h) - f(x0 - h)) / (2 * h);
    EXPECT_NEAR(fd, x.grad().item<double>(), scale / h + 1e-12) << x0;
  }
  for (double x0 : {-3.0, 2.5}) {  // clamped: flat, gradient 0
    st::Tensor x = st::scalar_tensor(x0, st::kFloat64).requires_grad_(true);
    q::fake_quantize_per_tensor_affine(x, scale, 0, -128, 127).backward();
    EXPECT_EQ((f(x0 + 0.1) - f(x0 - 0.1)) / 0.2, 0.0);
    EXPECT_EQ(x.grad().item<double>(), 0.0);
  }
  // NaN stays NaN and passes no gradient
  st::Tensor n = st::tensor({std::numeric_limits<float>::quiet_NaN(), 1.0f}).requires_grad_(true);
  st::Tensor yn = q::fake_quantize_per_tensor_affine(n, 0.1, 0, -128, 127);
  yn.sum().backward();
  EXPECT_TRUE(std::isnan(values(yn)[0]));
  EXPECT_EQ(values(n.grad()), (std::vector<double>{0.0, 1.0}));
  EXPECT_TRUE(throws_with([] { q::fake_quantize_per_tensor_affine(st::ones({2}), 0.1, 9, 0, 7); }, {"zero_point 9"}));
  EXPECT_TRUE(throws_with([] { q::fake_quantize_per_tensor_affine(st::ones({2}, st::kInt32), 0.1, 0, 0, 7); },
                          {"floating"}));
  EXPECT_TRUE(throws_with(
      [] { q::fake_quantize_per_channel_affine(st::ones({2, 3}), st::ones({2}), st::zeros({2}, st::kInt32), 1, 0, 7); },
      {"shape (3)"}));
}

TEST(Observers, RunningRangesAndQparams) {
  q::MinMaxObserver mm;
  q::MovingAverageMinMaxObserver ma(q::ObserverOptions{.averaging_constant = 0.25});
  const st::Tensor a = st::tensor({-1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN()});
  const st::Tensor b = st::tensor({-3.0f, 1.0f, std::numeric_limits<float>::infinity()});
  for (q::Observer* o : {static_cast<q::Observer*>(&mm), static_cast<q::Observer*>(&ma)}) {
    (*o)(a);
    (*o)(b);
  }
  EXPECT_EQ(mm.min_val.item<float>(), -3.0f);
  EXPECT_EQ(mm.max_val.item<float>(), 2.0f);
  EXPECT_FLOAT_EQ(ma.min_val.item<float>(), -1.0f + 0.25f * (-3.0f + 1.0f));
  EXPECT_FLOAT_EQ(ma.max_val.item<float>(), 2.0f + 0.25f * (1.0f - 2.0f));
  auto [s, z] = mm.calculate_qparams();  // uint8 affine over [-3, 2]
  EXPECT_FLOAT_EQ(s.item<float>(), 5.0f / 255);
  EXPECT_EQ(z.item<int32_t>(), int(round_half_even(3.0 / (5.0 / 255))));

  q::PerChannelMinMaxObserver pc;  // int8 symmetric along dim 0
  pc(st::tensor({{1.0f, -4.0f}, {0.5f, 0.25f}}));
  auto [ps, pz] = pc.calculate_qparams();
  EXPECT_TRUE(all_close(ps, {4.0 / 127.5, 0.5 / 127.5}, 1e-6, 0));
  EXPECT_TRUE(all_close(pz, {0, 0}, 0, 0));
  EXPECT_TRUE(throws_with([&] { pc(st::ones({3, 2})); }, {"observed 2 channels"}));
  EXPECT_TRUE(throws_with([] { q::MinMaxObserver({.qscheme = q::QScheme::PerChannelAffine}); }, {"per-tensor"}));
}

TEST(FakeQuantize, ModuleSwitches) {
  auto fq = q::default_fake_quant();
  const st::Tensor x = st::tensor({-1.0f, 0.3f, 2.0f});
  const st::Tensor y = (*fq)(x);
  EXPECT_FLOAT_EQ(fq->scale.item<float>(), 3.0f / 255);
  EXPECT_TRUE(all_close(y, values(q::fake_quantize_per_tensor_affine(x, fq->scale.item<float>(),
                                                                      fq->zero_point.item<int32_t>(), 0, 255)),
                        0, 0));
  fq->disable_observer();
  (*fq)(x * 10.0);
  EXPECT_FLOAT_EQ(fq->scale.item<float>(), 3.0f / 255);  // frozen
  fq->disable_fake_quant();
  EXPECT_TRUE(all_close((*fq)(x), values(x), 0, 0));
  const st::nn::StateDict sd = fq->state_dict();
  for (const char* key : {"scale", "zero_point", "fake_quant_enabled", "observer_enabled",
                          "activation_post_process.min_val", "activation_post_process.max_val"})
    EXPECT_EQ(sd.count(key), 1u) << key;
}

TEST(Qat, RegressionTrainsAndConvertsClose) {
  st::manual_seed(21);
  const int64_t in = 8, out = 4, n = 256;
  const st::Tensor true_w = st::randn({out, in}), true_b = st::randn({out});
  const st::Tensor x = st::randn({n, in});
  const st::Tensor target = st::nn::functional::linear(x, true_w, true_b);
  st::nn::Sequential model(st::nn::Linear(in, 16), st::nn::ReLU(), st::nn::Linear(16, out));
  EXPECT_EQ(q::prepare_qat(model), 2);
  EXPECT_EQ(model.state_dict().count("0.qat.weight_fake_quant.scale"), 1u);
  EXPECT_EQ(model.state_dict().count("2.qat.input_fake_quant.activation_post_process.min_val"), 1u);
  EXPECT_TRUE(throws_with([&] { q::prepare_qat(model); }, {"prepare_qat", "already"}));
  st::optim::Adam opt(model.parameters(), {.lr = 0.01});
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    st::Tensor loss = st::nn::functional::mse_loss(model(x), target);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.05 * first) << first << " -> " << last;

  model.eval();
  for (auto& [name, m] : model.named_modules())
    if (auto* fq = dynamic_cast<q::FakeQuantize*>(m)) fq->disable_observer();
  const st::Tensor fake = model(x).detach();
  // a prepared model's state (weights, observers, qparams, switches) loads into a fresh one
  st::nn::Sequential twin(st::nn::Linear(in, 16), st::nn::ReLU(), st::nn::Linear(16, out));
  q::prepare_qat(twin);
  twin.load_state_dict(model.state_dict());
  twin.eval();
  EXPECT_TRUE(all_close(twin(x), values(fake), 0, 0));
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_EQ(model.state_dict().count("0.quantized.weight_int8"), 1u);
  EXPECT_EQ(model.state_dict().count("0.quantized.input_scale"), 1u);
  const st::Tensor real = model(x);
  // the same integers and scales: only the order of float sums differs
  EXPECT_TRUE(all_close(real, values(fake), 1e-4, 1e-4));
  EXPECT_TRUE(throws_with([&] { q::quantize_dynamic(model); }, {"already"}));
}

TEST(Qat, ConvertedStateDictLoadsIntoAConvertedModelOnly) {
  st::manual_seed(22);
  auto make = [] {
    auto m = std::make_unique<st::nn::Sequential>(st::nn::Linear(6, 5), st::nn::ReLU(), st::nn::Linear(5, 3));
    q::prepare_qat(*m);
    return m;
  };
  auto a = make(), b = make();
  const st::Tensor x = st::randn({7, 6});
  (*a)(x);  // observe, so a's qparams differ from b's
  q::convert(*a);
  q::convert(*b);
  const st::Tensor want = (*a)(x);
  ASSERT_FALSE(all_close((*b)(x), values(want), 1e-3, 1e-3));
  b->load_state_dict(a->state_dict());
  EXPECT_TRUE(all_close((*b)(x), values(want), 0, 0));  // codes, scales and the input's qparams
  // a float model, a prepared one and a dynamically quantized one refuse it, naming the keys
  st::nn::Sequential plain(st::nn::Linear(6, 5), st::nn::ReLU(), st::nn::Linear(5, 3));
  EXPECT_TRUE(throws_with([&] { plain.load_state_dict(a->state_dict()); }, {"0.weight", "0.quantized"}));
  EXPECT_TRUE(throws_with([&] { make()->load_state_dict(a->state_dict()); }, {"0.qat", "0.quantized"}));
  st::nn::Sequential dynamic(st::nn::Linear(6, 5), st::nn::ReLU(), st::nn::Linear(5, 3));
  q::quantize_dynamic(dynamic);
  EXPECT_TRUE(throws_with([&] { dynamic.load_state_dict(a->state_dict()); }, {"0.quantized.input_scale"}));
  // float64 holds every float32 scale: the converted model computes the same after to(kFloat64)
  a->to(st::kFloat64);
  EXPECT_TRUE(all_close((*a)(x.to(st::kFloat64)), values(want), 0, 0));
}
