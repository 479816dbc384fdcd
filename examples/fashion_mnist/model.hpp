// A small ResNet-style CNN for 28x28 grey images, sized for CPU training: a 3x3 stem at full
// resolution, a wider strided conv down to 14x14 (cheaper than max-pooling the
// full-resolution maps), a max-pool to 7x7, one residual block and a wider conv at 7x7,
// global average pooling and a linear classifier. Every conv is followed by BatchNorm (so
// convs have no bias) and ReLU. With width 32 the channels are 32/64/128 and the forward pass
// costs about 11M multiply-adds per image.
#pragma once

#include <cstdint>

#include <strata/strata.hpp>

namespace fashion {

namespace st = strata;
namespace nn = strata::nn;

// conv 3x3 (same padding, no bias) -> BatchNorm -> ReLU
struct ConvBN : nn::Module {
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
  ConvBN(int64_t in, int64_t out, int64_t stride = 1)
      : conv(in, out, 3, {.stride = stride, .padding = 1, .bias = false}), bn(out) {
    register_module("conv", conv);
    register_module("bn", bn);
  }
  st::Tensor forward(const st::Tensor& x) override { return bn.forward_relu(conv(x)); }
  std::string name() const override { return "ConvBN"; }
};

// x + BN(conv(ConvBN(x))), then ReLU: the basic block of ResNet, channels unchanged.
struct ResidualBlock : nn::Module {
  ConvBN first;
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
  explicit ResidualBlock(int64_t channels)
      : first(channels, channels), conv(channels, channels, 3, {.padding = 1, .bias = false}), bn(channels) {
    register_module("first", first);
    register_module("conv", conv);
    register_module("bn", bn);
  }
  st::Tensor forward(const st::Tensor& x) override { return bn.forward_relu(conv(first(x)), x); }
  std::string name() const override { return "ResidualBlock"; }
};

// (N, 1, 28, 28) normalized images -> (N, classes) logits.
struct Net : nn::Module {
  ConvBN stem, down1, down2;
  ResidualBlock block;
  nn::MaxPool2d pool{2};
  nn::AdaptiveAvgPool2d gap{1};
  nn::Linear head;
  explicit Net(int64_t width = 32, int64_t classes = 10)
      : stem(1, width), down1(width, 2 * width, 2), down2(2 * width, 4 * width), block(2 * width),
        head(4 * width, classes) {
    register_module("stem", stem);
    register_module("down1", down1);
    register_module("block", block);
    register_module("down2", down2);
    register_module("head", head);
  }
  st::Tensor forward(const st::Tensor& x) override {
    st::Tensor h = pool(down1(stem(x)));  // 28 -> 14 (strided conv) -> 7
    h = down2(block(h));                  // 7x7, 4 * width channels
    return head(gap(h).flatten(1));
  }
  std::string name() const override { return "Net"; }
};

}  // namespace fashion
