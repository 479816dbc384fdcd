// ResNet-50 v1.5, laid out as torchvision's resnet50 so that its state_dict names match
// ("layer2.0.downsample.0.weight", "fc.bias"): a 7x7 stride-2 stem and a 3x3 stride-2
// max-pool, four stages of 3/4/6/3 bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4, each
// followed by BatchNorm), global average pooling and a linear classifier. v1.5 puts a stage's
// stride on the 3x3 conv rather than the first 1x1 conv, which costs a little more compute and
// is what torchvision and the MLPerf reference train. With 1000 classes it has 25,557,032
// parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <strata/strata.hpp>

namespace resnet {

namespace st = strata;
namespace nn = strata::nn;

struct Config {
  int64_t classes = 1000;
  // Start each block's last BatchNorm at gamma = 0, so every residual branch starts as the
  // identity (Goyal et al., "Accurate, Large Minibatch SGD"); helps large-batch training.
  bool zero_init_residual = false;
};

// 1x1 conv -> BN -> ReLU -> 3x3 conv (stride) -> BN -> ReLU -> 1x1 conv -> BN, plus the input
// (projected by a strided 1x1 conv and BN when the shape changes), then ReLU.
struct Bottleneck : nn::Module {
  static constexpr int64_t kExpansion = 4;
  nn::Conv2d conv1, conv2, conv3;
  nn::BatchNorm2d bn1, bn2, bn3;
  nn::Sequential* downsample = nullptr;  // owned by this module when present

  Bottleneck(int64_t in, int64_t width, int64_t stride)
      : conv1(in, width, 1, {.bias = false}),
        conv2(width, width, 3, {.stride = stride, .padding = 1, .bias = false}),
        conv3(width, width * kExpansion, 1, {.bias = false}), bn1(width), bn2(width), bn3(width * kExpansion) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("conv3", conv3);
    register_module("bn3", bn3);
    const int64_t out = width * kExpansion;
    if (stride != 1 || in != out)
      downsample = &register_module(
          "downsample", std::make_unique<nn::Sequential>(nn::Conv2d(in, out, 1, {.stride = stride, .bias = false}),
                                                         nn::BatchNorm2d(out)));
  }
  st::Tensor forward(const st::Tensor& x) override {
    // BN, ReLU and the shortcut's add in one pass each (BatchNorm2d::forward_relu)
    st::Tensor h = bn1.forward_relu(conv1(x));
    h = bn2.forward_relu(conv2(h));
    return bn3.forward_relu(conv3(h), downsample ? (*downsample)(x) : x);
  }
  std::string name() const override { return "Bottleneck"; }
};

// (N, 3, H, W) normalized images -> (N, classes) logits; H and W of at least 32 (the stem and
// stages downsample by 32 in all).
struct ResNet50 : nn::Module {
  nn::Conv2d conv1{3, 64, 7, {.stride = 2, .padding = 3, .bias = false}};
  nn::BatchNorm2d bn1{64};
  nn::MaxPool2d maxpool{3, {.stride = 2, .padding = 1}};
  nn::Sequential layer1, layer2, layer3, layer4;
  nn::AdaptiveAvgPool2d avgpool{1};
  nn::Linear fc;

  explicit ResNet50(const Config& cfg = {}) : fc(512 * Bottleneck::kExpansion, cfg.classes) {
    STRATA_CHECK(cfg.classes > 0, "[resnet50] the number of classes must be positive, got {}", cfg.classes);
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    int64_t in = 64;
    const int64_t blocks[4] = {3, 4, 6, 3};
    nn::Sequential* stages[4] = {&layer1, &layer2, &layer3, &layer4};
    for (int s = 0; s < 4; ++s) {
      const int64_t width = int64_t{64} << s;
      for (int64_t b = 0; b < blocks[s]; ++b) {
        stages[s]->push_back(std::make_unique<Bottleneck>(in, width, b == 0 && s > 0 ? 2 : 1));
        in = width * Bottleneck::kExpansion;
      }
      register_module("layer" + std::to_string(s + 1), *stages[s]);
    }
    register_module("fc", fc);
    init_weights(cfg.zero_init_residual);
  }

  st::Tensor forward(const st::Tensor& x) override {
    STRATA_CHECK(x.dim() == 4 && x.size(1) == 3,
                 "[resnet50] expected images of shape (N, 3, H, W), got {} dims with {} channels", x.dim(),
                 x.dim() > 1 ? x.size(1) : 0);
    st::Tensor h = maxpool(bn1.forward_relu(conv1(x)));
    h = layer4(layer3(layer2(layer1(h))));
    return fc(avgpool(h).flatten(1));
  }
  std::string name() const override { return "ResNet50"; }

 private:
  // torchvision's initialisation: He-normal (fan_out) convs, BatchNorm at gamma 1, beta 0
  // (the BatchNorm default), the linear layer at its default.
  void init_weights(bool zero_init_residual) {
    for (auto& [name, m] : named_modules()) {
      if (auto* conv = dynamic_cast<nn::Conv2d*>(m)) nn::init::kaiming_normal_(conv->weight, 0, "fan_out", "relu");
      if (auto* block = dynamic_cast<Bottleneck*>(m); block && zero_init_residual) nn::init::zeros_(block->bn3.weight);
    }
  }
};

}  // namespace resnet
