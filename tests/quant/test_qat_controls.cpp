// QAT's switches over a model, as PyTorch's model.apply(torch.ao.quantization.disable_observer)
// and torch.ao.nn.intrinsic.qat.freeze_bn_stats: frozen batch norm statistics stop changing in
// training and the forward folds and normalizes with them (checked against the computation written
// out in the test); disabled observers keep their ranges and qparams; disabled fake quant gives the
// float model's output.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::values;

namespace {

// Every FakeQuantize's buffers and its observer's range, by name.
std::map<std::string, std::vector<double>> fake_quant_state(nn::Module& model) {
  std::map<std::string, std::vector<double>> out;
  for (auto& [name, m] : model.named_modules())
    if (auto* fq = dynamic_cast<q::FakeQuantize*>(m)) {
      out[name + ".scale"] = values(fq->scale);
      out[name + ".zero_point"] = values(fq->zero_point);
      out[name + ".min"] = values(fq->observer().min_val);
      out[name + ".max"] = values(fq->observer().max_val);
    }
  return out;
}

}  // namespace

TEST(QatControls, FrozenBatchNormStatsStopChangingAndFoldTheWeight) {
  st::manual_seed(41);
  const st::Tensor x = st::randn({8, 2, 5, 5}) * 1.5 + 0.3;
  nn::Sequential model(nn::Conv2d(2, 3, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(3), nn::ReLU());
  q::fuse_modules_qat(model, {{"0", "1", "2"}});
  q::prepare_qat(model);
  st::optim::SGD opt(model.parameters(), {.lr = 0.05});
  const auto step = [&] {
    st::Tensor loss = F::mse_loss(model(x), st::zeros({8, 3, 5, 5}) + 0.4);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  auto& fused = model.at<q::FusedModule>(0);
  auto& bn = fused.at<nn::BatchNorm2d>(1);
  step();
  const std::vector<double> mean0 = values(bn.running_mean);
  step();
  EXPECT_NE(values(bn.running_mean), mean0);  // statistics update while not frozen

  model.apply(q::freeze_bn_stats);  // PyTorch's spelling; q::freeze_bn_stats(model) does the same
  EXPECT_TRUE(fused.bn_frozen());
  model.train();                    // keeps the frozen batch norm in eval
  EXPECT_TRUE(fused.is_training());
  EXPECT_FALSE(bn.is_training());
  const std::vector<double> mean = values(bn.running_mean), var = values(bn.running_var);
  const std::vector<double> gamma_before = values(bn.weight);
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(values(bn.running_mean), mean);
  EXPECT_EQ(values(bn.running_var), var);
  EXPECT_NE(values(bn.weight), gamma_before);  // gamma and beta still train

  // the training forward by hand: the weight folded with the frozen variance, fake-quantized, the
  // product scaled back, then batch norm with the frozen statistics, then ReLU
  const st::Tensor y = model(x);
  auto& conv = fused.at<nn::Conv2d>(0);
  auto& fq_in = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.input_fake_quant"));
  auto& fq_w = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.weight_fake_quant"));
  st::NoGradGuard no_grad;
  const st::Tensor s = bn.weight / st::sqrt(st::from_vector(var).to(st::kFloat32) + bn.options.eps);
  const st::Tensor wq = q::fake_quantize_per_channel_affine(conv.weight * s.reshape({3, 1, 1, 1}), fq_w.scale,
                                                            fq_w.zero_point, 0, -128, 127);
  const st::Tensor xq = q::fake_quantize_per_tensor_affine(x, values(fq_in.scale)[0],
                                                           int64_t(values(fq_in.zero_point)[0]), 0, 255);
  const st::Tensor product = F::conv2d(xq, wq, st::Tensor(), {.padding = 1}) / s.reshape({1, 3, 1, 1});
  const st::Tensor m = st::from_vector(mean).to(st::kFloat32).reshape({1, 3, 1, 1});
  const st::Tensor v = st::from_vector(var).to(st::kFloat32).reshape({1, 3, 1, 1});
  const st::Tensor want = F::relu((product - m) / st::sqrt(v + bn.options.eps) * bn.weight.reshape({1, 3, 1, 1}) +
                                  bn.bias.reshape({1, 3, 1, 1}));
  EXPECT_TRUE(all_close(y, values(want), 1e-5, 1e-5));

  q::update_bn_stats(model);
  EXPECT_FALSE(fused.bn_frozen());
  EXPECT_TRUE(bn.is_training());
  model(x);
  EXPECT_NE(values(bn.running_mean), mean);
}

TEST(QatControls, DisabledObserversKeepTheirRangesAndFakeQuantSwitchesOff) {
  st::manual_seed(42);
  nn::Sequential model(nn::Linear(6, 5), nn::ReLU(), nn::Linear(5, 3));
  q::prepare_qat(model);
  const st::Tensor x = st::randn({10, 6});
  model(x);
  model(x * 0.5);

  model.apply(q::disable_observer);
  const auto frozen = fake_quant_state(model);
  ASSERT_EQ(frozen.size(), 16u);  // 4 fake quants
  const st::Tensor big = x * 100.0 + 7.0;  // far outside the observed ranges
  const st::Tensor y_frozen = model(big);
  EXPECT_EQ(fake_quant_state(model), frozen);
  // with the input's qparams kept, the large input saturates at the top code
  auto& fq_in = dynamic_cast<q::FakeQuantize&>(model.get_submodule("0.qat.input_fake_quant"));
  const double top = (255 - values(fq_in.zero_point)[0]) * values(fq_in.scale)[0];
  const std::vector<double> saturated = values(fq_in(big));
  EXPECT_NEAR(*std::max_element(saturated.begin(), saturated.end()), top, 1e-6 * top);

  q::disable_fake_quant(model);
  {
    auto& l0 = model.at<nn::Linear>(0);
    auto& l2 = model.at<nn::Linear>(2);
    st::NoGradGuard no_grad;
    const st::Tensor want = F::linear(F::relu(F::linear(big, l0.weight, l0.bias)), l2.weight, l2.bias);
    EXPECT_TRUE(all_close(model(big), values(want), 1e-6, 1e-6));
  }
  q::enable_fake_quant(model);
  EXPECT_TRUE(all_close(model(big), values(y_frozen), 0, 0));

  q::enable_observer(model);
  model(big);
  EXPECT_NE(fake_quant_state(model), frozen);
  for (auto& [name, m] : model.named_modules())
    if (auto* fq = dynamic_cast<q::FakeQuantize*>(m)) EXPECT_TRUE(fq->observer_enabled() && fq->fake_quant_enabled());
}
