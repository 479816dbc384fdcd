// Module fusion: eval fusion folds batch norm exactly (float64 outputs equal the unfused model's
// to 1e-10), the fused layers' names, shapes and state dict keys, QAT fusion keeps batch norm,
// nn::Module::set_submodule, and the errors of bad groups (each leaving the model unchanged).
#include <cmath>
#include <memory>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
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

double max_abs_diff(const st::Tensor& a, const st::Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
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
  EXPECT_LE(max_abs_diff(got, want), 1e-10);
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
  EXPECT_LE(max_abs_diff(model(x), want), 1e-10);
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
  std::unique_ptr<nn::Module> old = seq.set_submodule("1", std::make_unique<nn::Identity>());
  EXPECT_EQ(old->name(), "ReLU");
  EXPECT_EQ(seq[1].name(), "Identity");  // the container's own list follows
  const st::Tensor x = st::randn({4, 2});
  const st::Tensor direct = seq.at<nn::Linear>(2)(seq.at<nn::Linear>(0)(x));
  EXPECT_TRUE(all_close(seq(x), values(direct), 0, 0));
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
