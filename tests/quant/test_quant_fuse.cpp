// Module fusion: eval fusion folds batch norm exactly (float64 outputs equal the unfused model's
// to 1e-10), the fused layers' names, shapes and state dict keys, QAT fusion keeps batch norm,
// nn::Module::set_submodule (and the quant modules that follow or refuse it), fusion keeping the
// mode and the random stream, and the errors of bad groups (each leaving the model unchanged).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::throws_with;
using st::testing::values;

namespace {

// Running statistics and affine parameters far from their initial values, so folding has work to do.
void randomize(nn::BatchNormBase& bn) {
  st::NoGradGuard no_grad;
  const int64_t c = bn.num_features;
  bn.running_mean.copy_(st::randn({c}));
  bn.running_var.copy_(st::rand({c}) + 0.5);
  bn.weight.copy_(st::randn({c}));
  bn.bias.copy_(st::randn({c}));
}

}  // namespace

TEST(FuseModules, ConvBatchNormReluFoldsExactlyInEval) {
  st::manual_seed(1);
  nn::Sequential model(nn::Conv2d(3, 6, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(6), nn::ReLU(),
                       nn::Conv2d(6, 4, 3, {.stride = {2, 1}, .dilation = {1, 2}, .groups = 2}), nn::BatchNorm2d(4),
                       nn::Conv2d(4, 4, 1), nn::ReLU());
  randomize(model.at<nn::BatchNorm2d>(1));
  randomize(model.at<nn::BatchNorm2d>(4));
  model.to(st::kFloat64);
  model.eval();
  const st::Tensor x = st::randn({2, 3, 9, 10}).to(st::kFloat64);
  const st::Tensor want = model(x);
  q::fuse_modules(model, {{"0", "1", "2"}, {"3", "4"}, {"5", "6"}});
  EXPECT_EQ(model[0].name(), "ConvReLU2d");
  EXPECT_EQ(model[1].name(), "Identity");
  EXPECT_EQ(model[2].name(), "Identity");
  EXPECT_EQ(model[3].name(), "Conv2d");  // conv + bn alone: a plain Conv2d, as PyTorch's
  EXPECT_EQ(model[4].name(), "Identity");
  EXPECT_EQ(model[5].name(), "ConvReLU2d");
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(sd.count("0.0.weight") + sd.count("0.0.bias") + sd.count("3.bias") + sd.count("5.0.weight"), 4u);
  EXPECT_EQ(sd.count("1.running_mean"), 0u);
  EXPECT_EQ(sd.at("0.0.weight").dtype(), st::kFloat64);
  const st::Tensor got = model(x);
  EXPECT_TRUE(all_close(got, values(want), 0, 1e-10));
  // the folded layer trains: its parameters take gradients
  model(x).sum().backward();
  EXPECT_TRUE(model.at<q::FusedModule>(0).at<nn::Conv2d>(0).bias.grad().defined());
}

TEST(FuseModules, LinearBatchNormAndLinearReluInNestedContainers) {
  st::manual_seed(2);
  auto inner = std::make_unique<nn::Sequential>(nn::Linear(5, 7), nn::BatchNorm1d(7));
  nn::Sequential model;
  model.push_back(std::move(inner));
  model.push_back(nn::Linear(7, 3));
  model.push_back(nn::ReLU());
  randomize(model.at<nn::Sequential>(0).at<nn::BatchNorm1d>(1));
  model.to(st::kFloat64);
  model.eval();
  const st::Tensor x = st::randn({6, 5}).to(st::kFloat64);
  const st::Tensor want = model(x);
  q::fuse_modules(model, {{"0.0", "0.1"}, {"1", "2"}});
  EXPECT_EQ(model.get_submodule("0.0").name(), "Linear");
  EXPECT_EQ(model.get_submodule("0.1").name(), "Identity");
  EXPECT_EQ(model[1].name(), "LinearReLU");
  EXPECT_TRUE(all_close(model(x), values(want), 0, 1e-10));
}

TEST(FuseModules, QatFusionKeepsBatchNormTraining) {
  st::manual_seed(3);
  nn::Sequential model(nn::Conv2d(2, 4, 3), nn::BatchNorm2d(4), nn::ReLU());
  const st::Tensor x = st::randn({3, 2, 6, 6});
  const st::Tensor want = model(x);  // training: batch statistics
  const st::Tensor mean_after_one = model.at<nn::BatchNorm2d>(1).running_mean.clone();
  q::fuse_modules_qat(model, {{"0", "1", "2"}});
  auto& fused = model.at<q::FusedModule>(0);
  EXPECT_EQ(fused.name(), "ConvBnReLU2d");
  EXPECT_TRUE(fused.has_batch_norm() && fused.has_relu());
  EXPECT_EQ(model.state_dict().count("0.1.running_mean"), 1u);
  EXPECT_TRUE(all_close(model(x), values(want), 1e-6, 1e-6));
  // the batch norm still moves its running statistics
  EXPECT_FALSE(all_close(fused.at<nn::BatchNorm2d>(1).running_mean, values(mean_after_one), 1e-9, 1e-9));
}

// Batch norm without affine parameters (gamma 1, beta 0) after a layer without bias: eval fusion
// against the unfused float64 model, and the QAT form's eval forward against its formula.
TEST(FuseModules, BatchNormWithoutAffineAfterALayerWithoutBias) {
  st::manual_seed(5);
  const auto make = [] {
    auto m = std::make_unique<nn::Sequential>(nn::Conv2d(2, 3, 3, {.bias = false}),
                                              nn::BatchNorm2d(3, {.affine = false}));
    st::NoGradGuard no_grad;
    m->at<nn::BatchNorm2d>(1).running_mean.copy_(st::randn({3}));
    m->at<nn::BatchNorm2d>(1).running_var.copy_(st::rand({3}) + 0.5);
    return m;
  };
  auto model = make();
  model->to(st::kFloat64);
  model->eval();
  const st::Tensor x = st::randn({2, 2, 6, 6}).to(st::kFloat64);
  const std::vector<double> want = values((*model)(x));
  q::fuse_modules(*model, {{"0", "1"}});
  EXPECT_TRUE(all_close((*model)(x), want, 0, 1e-10));

  auto qat = make();
  const st::Tensor mean = qat->at<nn::BatchNorm2d>(1).running_mean.clone();
  const st::Tensor var = qat->at<nn::BatchNorm2d>(1).running_var.clone();
  q::fuse_modules_qat(*qat, {{"0", "1"}});
  q::prepare_qat(*qat);
  qat->eval();
  const st::Tensor xf = st::randn({2, 2, 6, 6});
  const st::Tensor y = (*qat)(xf);
  auto& conv = qat->at<q::FusedModule>(0).at<nn::Conv2d>(0);
  auto& fq_in = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.input_fake_quant"));
  auto& fq_w = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.weight_fake_quant"));
  st::NoGradGuard no_grad;
  const st::Tensor s = st::rsqrt(var + 1e-5);  // gamma 1
  const st::Tensor wq = q::fake_quantize_per_channel_affine(conv.weight * s.reshape({3, 1, 1, 1}), fq_w.scale,
                                                            fq_w.zero_point, 0, -128, 127);
  const st::Tensor xq = q::fake_quantize_per_tensor_affine(xf, values(fq_in.scale)[0],
                                                           int64_t(values(fq_in.zero_point)[0]), 0, 255);
  EXPECT_TRUE(all_close(y, values(F::conv2d(xq, wq, mean * s * -1.0)), 1e-5, 1e-5));
}

TEST(FuseModules, BadGroupsRaiseAndChangeNothing) {
  st::manual_seed(4);
  nn::Sequential model(nn::Conv2d(3, 6, 3), nn::BatchNorm2d(5), nn::ReLU(), nn::Linear(4, 4), nn::ReLU6());
  model.eval();
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"0", "9"}}); }, {"no submodule", "9"}));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"2", "0"}}); }, {"fuse_modules", "cannot fuse", "ReLU"}));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"3", "4"}}); }, {"cannot fuse", "ReLU6"}));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"0", "1"}}); }, {"5 features", "6 output channels"}));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"3"}}); }, {"2 or 3"}));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"3", "2"}, {"0", "2"}}); }, {"named twice"}));
  // a valid first group is not applied when a later one fails
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(model, {{"3", "2"}, {"0", "1"}}); }, {"features"}));
  EXPECT_EQ(model[3].name(), "Linear");
  model.train();
  nn::Sequential bn_model(nn::Conv2d(3, 6, 3), nn::BatchNorm2d(6));
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(bn_model, {{"0", "1"}}); }, {"training", "eval"}));
  bn_model.eval();
  EXPECT_TRUE(throws_with([&] { q::fuse_modules_qat(bn_model, {{"0", "1"}}); }, {"fuse_modules_qat", "train"}));
  nn::Sequential no_stats(nn::Conv2d(3, 6, 3), nn::BatchNorm2d(6, {.track_running_stats = false}));
  no_stats.eval();
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(no_stats, {{"0", "1"}}); }, {"running statistics"}));
  // a fused module holds the layers of its kind
  std::vector<std::unique_ptr<nn::Module>> linear_relu;
  linear_relu.push_back(std::make_unique<nn::Linear>(3, 3));
  linear_relu.push_back(std::make_unique<nn::ReLU>());
  EXPECT_TRUE(throws_with([&] { q::FusedModule(q::FusedKind::ConvBn2d, std::move(linear_relu)); },
                          {"ConvBn2d", "cannot hold", "Linear, ReLU"}));
  // data members cannot be replaced
  struct Net : nn::Module {
    nn::Conv2d conv{3, 4, 3};
    nn::ReLU relu;
    Net() {
      register_module("conv", conv);
      register_module("relu", relu);
    }
  } net;
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(net, {{"conv", "relu"}}); }, {"data member", "conv"}));
  EXPECT_EQ(net.get_submodule("conv").name(), "Conv2d");
}

TEST(SetSubmodule, ReplacesOwnedChildrenInPlace) {
  nn::Sequential seq(nn::Linear(2, 3), nn::ReLU(), nn::Linear(3, 1));
  int calls = 0;
  seq.register_forward_hook([&](nn::Module&, const st::Tensor&, const st::Tensor&) { ++calls; });
  std::unique_ptr<nn::Module> old = seq.set_submodule("1", std::make_unique<nn::Identity>());
  EXPECT_EQ(old->name(), "ReLU");
  EXPECT_EQ(seq[1].name(), "Identity");  // the container's own list follows
  const st::Tensor x = st::randn({4, 2});
  const st::Tensor direct = seq.at<nn::Linear>(2)(seq.at<nn::Linear>(0)(x));
  EXPECT_TRUE(all_close(seq(x), values(direct), 0, 0));
  EXPECT_EQ(calls, 1);  // the container's hooks stay
  // parameters, state dict and modules follow the new child, not the old one
  auto no_bias = std::make_unique<nn::Linear>(3, 1, nn::LinearOptions{.bias = false});
  std::unique_ptr<nn::Module> old_fc = seq.set_submodule("2", std::move(no_bias));
  EXPECT_EQ(seq.parameters().size(), 3u);
  EXPECT_EQ(seq.state_dict().count("2.bias"), 0u);
  EXPECT_EQ(&seq.get_submodule("2"), &seq[2]);
  EXPECT_NE(&seq[2], old_fc.get());
  for (const st::Tensor& p : old_fc->parameters())
    for (const st::Tensor& kept : seq.parameters()) EXPECT_NE(p.data(), kept.data());
  nn::ModuleDict dict;
  dict.insert("a", nn::ReLU());
  dict.set_submodule("a", std::make_unique<nn::Tanh>());
  EXPECT_EQ(dict["a"].name(), "Tanh");
  EXPECT_TRUE(throws_with([&] { seq.set_submodule("7", std::make_unique<nn::ReLU>()); }, {"no submodule", "7"}));
  EXPECT_TRUE(throws_with([&] { seq.set_submodule("0", nullptr); }, {"null"}));
  // a layer's form goes through set_form and take_form only
  q::quantize_dynamic(seq);
  EXPECT_TRUE(throws_with([&] { seq.set_submodule("0.quantized", std::make_unique<nn::Identity>()); },
                          {"set_form"}));
  EXPECT_FALSE(seq.owns_submodule("nope"));
  EXPECT_TRUE(seq.owns_submodule("0"));
}

// A module that keeps a pointer to a child it owns follows set_submodule, or refuses it: the old
// child is destroyed when the caller drops it, so a stale pointer would be used after free.
TEST(SetSubmodule, ChildrenThatQuantModulesPointToFollowOrRefuse) {
  st::manual_seed(9);
  nn::Sequential model(nn::Conv2d(2, 3, 3), nn::Flatten(), nn::Linear(3, 2));
  q::prepare_qat(model, {.filter = [](const std::string& n, const nn::Module&) { return n == "0"; }});
  auto plain = q::default_weight_fake_quant(3);
  plain->disable_fake_quant();
  model.set_submodule("0.qat.weight_fake_quant", std::move(plain));  // the old one is destroyed here
  const st::Tensor x = st::randn({4, 2, 3, 3});
  const st::Tensor y = model.at<nn::Conv2d>(0)(x);
  auto& conv = model.at<nn::Conv2d>(0);
  auto& fq_in = dynamic_cast<q::FakeQuantize&>(conv.get_submodule("qat.input_fake_quant"));
  const st::Tensor xq = q::fake_quantize_per_tensor_affine(x, values(fq_in.scale)[0],
                                                           int64_t(values(fq_in.zero_point)[0]), 0, 255);
  // the new weight fake quant, which passes the weight through, is the one used
  EXPECT_TRUE(all_close(y, values(F::conv2d(xq, conv.weight, conv.bias)), 1e-6, 1e-6));
  EXPECT_TRUE(throws_with([&] { model.set_submodule("0.qat.input_fake_quant", std::make_unique<nn::Identity>()); },
                          {"QatConv2dForm", "input_fake_quant", "FakeQuantize", "Identity"}));
  const std::string observer = "0.qat.input_fake_quant.activation_post_process";
  EXPECT_TRUE(throws_with([&] { model.set_submodule(observer, std::make_unique<q::MinMaxObserver>()); },
                          {"FakeQuantize", "observer"}));
  EXPECT_EQ(model.get_submodule("0.qat.input_fake_quant").name(), "FakeQuantize");

  nn::Sequential observed(nn::Linear(3, 2));
  q::prepare(observed);
  observed.set_submodule("0.observed.input_observer", std::make_unique<q::MinMaxObserver>());
  observed(st::randn({5, 3}));
  EXPECT_GT(dynamic_cast<q::Observer&>(observed.get_submodule("0.observed.input_observer")).min_val.numel(), 0);
  EXPECT_EQ(q::convert(observed), 1);

  // the QAT form of a fused Conv-BN reads the batch norm, which stays in place while prepared
  nn::Sequential fused(nn::Conv2d(2, 4, 3), nn::BatchNorm2d(4));
  q::fuse_modules_qat(fused, {{"0", "1"}});
  q::prepare_qat(fused);
  EXPECT_TRUE(throws_with([&] { fused.set_submodule("0.1", std::make_unique<nn::BatchNorm2d>(4)); },
                          {"ConvBn2d", "batch norm", "prepare_qat"}));
  EXPECT_EQ(fused.get_submodule("0.1").name(), "BatchNorm2d");
}

TEST(FuseModules, KeepsTheModeAndDrawsNoRandomNumbers) {
  nn::Sequential model(nn::Conv2d(2, 4, 3), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(), nn::Linear(4, 4),
                       nn::BatchNorm1d(4));
  model.eval();
  st::manual_seed(21);
  const std::vector<double> want = values(st::randn({8}));
  st::manual_seed(21);
  q::fuse_modules(model, {{"0", "1", "2"}, {"4", "5"}});
  EXPECT_TRUE(all_close(st::randn({8}), want, 0, 0));  // fusion leaves the random stream alone
  for (auto& [name, m] : model.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  // the layer and its batch norm share a mode, as PyTorch's fuser methods require
  nn::Sequential mixed(nn::Conv2d(2, 4, 3), nn::BatchNorm2d(4));
  mixed.eval();
  mixed[0].train();
  EXPECT_TRUE(throws_with([&] { q::fuse_modules(mixed, {{"0", "1"}}); }, {"\"0\"", "training", "\"1\"", "eval"}));
}
