// Learnable fake quantization (LSQ): values and gradients against PyTorch's
// _fake_quantize_learnable_*_affine backward written out in float64, finite differences of the
// forward, the module's modes, QAT with learned qparams converted, state dicts, bad input.
#include <algorithm>
#include <cmath>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::throws_with;
using st::testing::values;

namespace {

struct Ref {
  double y, dx, ds, dz;
};

// PyTorch's learnable fake-quant kernel for one element (float32 inverse scale and codes), dy = g.
Ref reference(double x, double s, double zp_param, int qmin, int qmax, double g, double f) {
  const double zp = std::clamp(std::nearbyint(zp_param), double(qmin), double(qmax));
  const float inv = 1.0f / float(s);
  const double code = std::nearbyint(double(float(x) * inv)) + zp;
  const double x_fq = (std::clamp(code, double(qmin), double(qmax)) - zp) * float(s);
  if (code < qmin) return {x_fq, 0, g * (qmin - zp) * f, -g * float(s) * f};
  if (code > qmax) return {x_fq, 0, g * (qmax - zp) * f, -g * float(s) * f};
  return {x_fq, g, g * (x_fq - float(x)) * double(inv) * f, 0};
}

}  // namespace

TEST(LearnableFakeQuant, PerTensorGradientsMatchPyTorchsFormula) {
  st::manual_seed(40);
  const double s0 = 0.1, zp0 = 3.3, f = 0.7;
  const int qmin = 0, qmax = 15;
  st::Tensor x = (st::rand({200}) * 2.4 - 0.7).requires_grad_(true);  // codes from about -4 to 21
  st::Tensor s = st::tensor({float(s0)}).requires_grad_(true), zp = st::tensor({float(zp0)}).requires_grad_(true);
  st::Tensor y = q::fake_quantize_learnable_per_tensor_affine(x, s, zp, qmin, qmax, f);
  const st::Tensor g = st::randn({200});
  (y * g).sum().backward();
  const auto xv = values(x), gv = values(g), yv = values(y), gx = values(x.grad());
  double ds = 0, dz = 0;
  int below = 0, above = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const Ref r = reference(xv[i], float(s0), float(zp0), qmin, qmax, gv[i], f);
    EXPECT_NEAR(yv[i], r.y, 1e-6) << xv[i];
    EXPECT_EQ(gx[i], r.dx) << xv[i];
    ds += r.ds;
    dz += r.dz;
    below += r.dz != 0 && xv[i] < 0;
    above += r.dz != 0 && xv[i] > 0;
  }
  ASSERT_GT(below, 5);
  ASSERT_GT(above, 5);
  EXPECT_NEAR(s.grad().item<double>(), ds, 1e-4 * (1 + std::abs(ds)));
  EXPECT_NEAR(zp.grad().item<double>(), dz, 1e-4 * (1 + std::abs(dz)));
}

TEST(LearnableFakeQuant, PerChannelGradientsMatchPyTorchsFormula) {
  st::manual_seed(41);
  const int qmin = -8, qmax = 7;
  const std::vector<double> sv = {0.05, 0.2, 0.11}, zv = {0.4, -2.6, 1.0};
  st::Tensor x = (st::randn({4, 3, 5}) * 0.6).requires_grad_(true);
  st::Tensor s = st::from_vector(sv).to(st::kFloat32).requires_grad_(true);
  st::Tensor zp = st::from_vector(zv).to(st::kFloat32).requires_grad_(true);
  st::Tensor y = q::fake_quantize_learnable_per_channel_affine(x, s, zp, 1, qmin, qmax);
  const st::Tensor g = st::randn({4, 3, 5});
  (y * g).sum().backward();
  const auto xv = values(x), gv = values(g), yv = values(y), gx = values(x.grad());
  std::vector<double> ds(3, 0.0), dz(3, 0.0);
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 5) % 3;
    const Ref r = reference(xv[i], float(sv[c]), float(zv[c]), qmin, qmax, gv[i], 1.0);
    EXPECT_NEAR(yv[i], r.y, 1e-6) << i;
    EXPECT_EQ(gx[i], r.dx) << i;
    ds[c] += r.ds;
    dz[c] += r.dz;
  }
  EXPECT_TRUE(all_close(s.grad(), ds, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(zp.grad(), dz, 1e-4, 1e-4));
  EXPECT_NE(dz[0], 0.0);  // channel 0's small scale clamps some codes
}

TEST(LearnableFakeQuant, FiniteDifferencesAwayFromRoundingBoundaries) {
  // With the codes fixed (x / s a quarter step from a rounding boundary, h small), the output
  // (q - zp) * s has d/ds = q - zp: LSQ's gradient is that minus x / s inside the range (the
  // straight-through term of round) and exactly that where clamped. The forward rounds the zero
  // point, so its difference is taken over one whole code: -s outside, 0 inside, as LSQ's.
  const double s0 = 0.25, h = 1e-3;
  const int qmin = -8, qmax = 7;
  const std::vector<double> xs = {-3.2, -1.3, -0.2, 0.3, 1.05, 1.45, 2.8};  // codes -13, -5, -1, 1, 4, 6, 11
  const auto out = [&](double s, double zp) {
    return values(q::fake_quantize_learnable_per_tensor_affine(st::from_vector(xs), st::tensor({float(s)}),
                                                               st::tensor({float(zp)}), qmin, qmax));
  };
  const auto up = out(s0 + h, 0), down = out(s0 - h, 0), zup = out(s0, 1), zdown = out(s0, -1);
  for (size_t i = 0; i < xs.size(); ++i) {
    st::Tensor s = st::tensor({float(s0)}).requires_grad_(true), zp = st::tensor({0.0f}).requires_grad_(true);
    q::fake_quantize_learnable_per_tensor_affine(st::from_vector(std::vector<double>{xs[i]}), s, zp, qmin, qmax)
        .sum()
        .backward();
    const double code = std::nearbyint(xs[i] / s0);
    const bool inside = code >= qmin && code <= qmax;
    const double fd = (up[i] - down[i]) / (2 * h);
    EXPECT_NEAR(s.grad().item<double>(), inside ? fd - xs[i] / s0 : fd, 1e-3) << xs[i];
    EXPECT_NEAR(zp.grad().item<double>(), (zup[i] - zdown[i]) / 2, 1e-6) << xs[i];
  }
}

TEST(LearnableFakeQuant, ModesAndObserverCopy) {
  st::manual_seed(42);
  auto fq = q::learnable_fake_quant();
  const st::Tensor x = st::randn({64}) * 3.0;
  st::Tensor y = (*fq)(x);  // static estimate: the observer's qparams copied in
  auto [s, z] = fq->calculate_qparams();
  EXPECT_TRUE(all_close(fq->scale, values(s), 0, 0));
  EXPECT_TRUE(all_close(fq->zero_point, values(z.to(st::kFloat64)), 0, 0));
  EXPECT_TRUE(all_close(y, values(q::fake_quantize_per_tensor_affine(x, s.item<double>(), z.item<int64_t>(), 0, 255)),
                        0, 0));
  fq->enable_param_learning();
  EXPECT_TRUE(fq->learning_enabled() && fq->scale.requires_grad() && !fq->observer_enabled());
  {
    st::NoGradGuard no_grad;
    fq->scale.fill_(-1.0);  // an optimizer step past zero: clamped to eps at the next forward
  }
  (*fq)(x);
  EXPECT_FLOAT_EQ(fq->scale.item<float>(), 1.1920928955078125e-07f);
  fq->enable_static_observation();
  EXPECT_FALSE(fq->learning_enabled() || fq->scale.requires_grad() || fq->fake_quant_enabled());
  EXPECT_TRUE(all_close((*fq)(x), values(x), 0, 0));
  q::disable_observer(*fq);  // qat.hpp's switches reach it
  EXPECT_FALSE(fq->observer_enabled());
  // symmetric weights: the zero point stays at the symmetric code
  auto w = q::learnable_weight_fake_quant(3);
  {
    st::NoGradGuard no_grad;
    w->zero_point.fill_(2.0);
  }
  w->enable_param_learning();
  (*w)(st::randn({3, 4}));
  EXPECT_TRUE(all_close(w->zero_point, {0.0, 0.0, 0.0}, 0, 0));
  // an empty batch (observer off, grad scaling on) gives an empty output, no gradient factor of inf
  st::Tensor ye = (*w)(st::zeros({3, 0}).requires_grad_(true));
  EXPECT_EQ(ye.numel(), 0);
  ye.sum().backward();
  EXPECT_TRUE(all_close(w->scale.grad(), {0.0, 0.0, 0.0}, 0, 0));
}

TEST(LearnableFakeQuant, QatTrainsAndConvertsWithTheLearnedQparams) {
  st::manual_seed(43);
  const int64_t in = 8, out = 4, n = 256;
  const st::Tensor true_w = st::randn({out, in}), true_b = st::randn({out});
  const st::Tensor x = st::randn({n, in});
  const st::Tensor target = st::nn::functional::linear(x, true_w, true_b);
  const auto make = [] {
    auto m = std::make_unique<st::nn::Sequential>(st::nn::Linear(8, 16), st::nn::ReLU(), st::nn::Linear(16, 4));
    q::prepare_qat(*m, {.input_fake_quant = [] { return q::learnable_fake_quant(); },
                        .weight_fake_quant = [](int64_t c) { return q::learnable_weight_fake_quant(c); }});
    return m;
  };
  auto model = make();
  EXPECT_EQ(model->state_dict().count("0.qat.weight_fake_quant.learning_enabled"), 1u);
  st::optim::Adam opt(model->parameters(), {.lr = 0.01});
  double first = 0, last = 0;
  st::Tensor observed_scale;
  for (int step = 0; step < 300; ++step) {
    if (step == 20) {  // LSQ: initialize from the observers, then learn the qparams
      q::enable_param_learning(*model);
      observed_scale = model->state_dict().at("2.qat.input_fake_quant.scale").clone();
    }
    st::Tensor loss = st::nn::functional::mse_loss((*model)(x), target);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.05 * first) << first << " -> " << last;
  const st::Tensor learned = model->state_dict().at("2.qat.input_fake_quant.scale");
  const st::Tensor learned_zero = model->state_dict().at("2.qat.input_fake_quant.zero_point");
  EXPECT_GT(std::abs(learned.item<double>() - observed_scale.item<double>()), 1e-4);  // the scale trained
  model->eval();
  const st::Tensor fake = (*model)(x).detach();
  // the prepared state (learned qparams, switches, observers) loads into a fresh model
  auto twin = make();
  twin->load_state_dict(model->state_dict());
  twin->eval();
  EXPECT_TRUE(all_close((*twin)(x), values(fake), 0, 0));
  EXPECT_EQ(q::convert(*model), 2);
  EXPECT_FLOAT_EQ(model->state_dict().at("2.quantized.input_scale").item<float>(), learned.item<float>());
  EXPECT_EQ(model->state_dict().at("2.quantized.input_zero_point").item<int64_t>(),
            int64_t(std::clamp(std::nearbyint(learned_zero.item<double>()), 0.0, 255.0)));
  // the same integers and scales: the outputs differ by float sums only, far below one step
  EXPECT_TRUE(all_close((*model)(x), values(fake), 1e-4, 1e-4));
}

TEST(LearnableFakeQuant, BadInput) {
  const st::Tensor x = st::randn({4, 3}), one = st::tensor({1.0f});
  EXPECT_TRUE(throws_with([&] { q::fake_quantize_learnable_per_tensor_affine(x, st::tensor({0.0f}), one, 0, 255); },
                          {"fake_quantize_learnable_per_tensor_affine", "positive"}));
  EXPECT_TRUE(throws_with([&] { q::fake_quantize_learnable_per_tensor_affine(x, st::ones({2}), one, 0, 255); },
                          {"fake_quantize_learnable_per_tensor_affine", "1 element"}));
  EXPECT_TRUE(throws_with(
      [&] { q::fake_quantize_learnable_per_tensor_affine(x, one, st::tensor({NAN}), 0, 255); }, {"zero_point"}));
  EXPECT_TRUE(throws_with(
      [&] { q::fake_quantize_learnable_per_tensor_affine(x.to(st::kInt32), one, one, 0, 255); }, {"floating"}));
  EXPECT_TRUE(throws_with([&] { q::fake_quantize_learnable_per_tensor_affine(x, one, one, 5, 5); }, {"quant_min"}));
  EXPECT_TRUE(throws_with([&] { q::fake_quantize_learnable_per_channel_affine(x, one, one, 2, 0, 255); },
                          {"fake_quantize_learnable_per_channel_affine", "axis 2"}));
  EXPECT_TRUE(throws_with([&] { q::fake_quantize_learnable_per_channel_affine(x, st::ones({4}), st::ones({4}), 1,
                                                                              0, 255); }, {"3 element"}));
  EXPECT_TRUE(throws_with([&] { q::fake_quantize_learnable_per_tensor_affine(x, one, one, 0, 255, NAN); },
                          {"grad_factor"}));
  EXPECT_TRUE(throws_with([] { q::learnable_weight_fake_quant(0); }, {"num_channels"}));
  EXPECT_TRUE(throws_with([] {
    q::LearnableFakeQuantize(std::make_unique<q::PerChannelMinMaxObserver>(q::per_channel_defaults()));
  }, {"LearnableFakeQuantize", "sized"}));
  EXPECT_TRUE(throws_with([] {
    q::LearnableFakeQuantize(std::make_unique<q::MinMaxObserver>(q::ObserverOptions{}), {.scale = 0.0});
  }, {"initial scale"}));
  auto w = q::learnable_weight_fake_quant(5);  // sized for 5 channels, given 4
  EXPECT_TRUE(throws_with([&] { (*w)(st::randn({4, 2})); }, {"5 channels"}));
}

TEST(LearnableFakeQuant, OneElementQparamsOfAnyShapeGetGradientsOfTheirShape) {
  // a 0-d scale and a (1, 1) zero point hold one element each, as the per-tensor op accepts
  const st::Tensor x = st::from_vector(std::vector<double>{-3.0, 0.26, 1.1, 9.0}).to(st::kFloat32);
  st::Tensor s = st::tensor({0.5f}).reshape({}).requires_grad_(true);
  st::Tensor zp = st::tensor({1.0f}).reshape({1, 1}).requires_grad_(true);
  q::fake_quantize_learnable_per_tensor_affine(x, s, zp, 0, 15).sum().backward();
  ASSERT_EQ(s.grad().shape(), s.shape());
  ASSERT_EQ(zp.grad().shape(), zp.shape());
  // codes 1 + round(x / 0.5): -5 (below), 2, 3, 19 (above)
  double ds = 0, dz = 0;
  for (double xv : {-3.0, 0.26, 1.1, 9.0}) {
    const Ref r = reference(xv, 0.5, 1.0, 0, 15, 1.0, 1.0);
    ds += r.ds;
    dz += r.dz;
  }
  EXPECT_NEAR(s.grad().item<double>(), ds, 1e-5);
  EXPECT_NEAR(zp.grad().item<double>(), dz, 1e-5);
}

TEST(LearnableFakeQuant, SymmetricQparamsAreTheSymmetricCodeAfterTheZeroPointMoved) {
  // An optimizer step moves the symmetric weight fake quant's zero point parameter (its gradient
  // is -s * dy where weights clamp); the next forward puts it back at 0, so convert must too.
  st::manual_seed(44);
  auto model = std::make_unique<st::nn::Sequential>(st::nn::Linear(6, 5));
  q::prepare_qat(*model, {.input_fake_quant = [] { return q::learnable_fake_quant(); },
                          .weight_fake_quant = [](int64_t c) { return q::learnable_weight_fake_quant(c); }});
  const st::Tensor x = st::randn({12, 6});
  (*model)(x);
  q::enable_param_learning(*model);
  model->eval();
  const st::Tensor fake = (*model)(x).detach();
  auto& w = dynamic_cast<q::LearnableFakeQuantize&>(model->get_submodule("0.qat.weight_fake_quant"));
  {
    st::NoGradGuard no_grad;
    w.zero_point.fill_(0.8);
  }
  EXPECT_TRUE(all_close(w.qparams().second.to(st::kFloat64), {0, 0, 0, 0, 0}, 0, 0));
  EXPECT_TRUE(all_close((*model)(x), values(fake), 0, 0));  // the fake quant applies 0
  {
    st::NoGradGuard no_grad;
    w.zero_point.fill_(0.8);
  }
  q::convert(*model);
  EXPECT_TRUE(all_close((*model)(x), values(fake), 1e-4, 1e-4));
}
