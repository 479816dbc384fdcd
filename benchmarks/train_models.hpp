// The strata side of the end-to-end training benchmarks (bench_train, and bench_gpu's train
// rows): the two small models that have no example of their own (the MLP and the
// CIFAR-sized ResNet-style CNN), the trainer that runs any model through one full training
// step, and make_strata_trainer for a workload. ResNet-50 and GPT come from examples/.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include <strata/strata.hpp>

#include "resnet50/model.hpp"
#include "train_workload.h"
#include "transformer/gpt.hpp"

namespace bench {

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;

// 784-1024-1024-10 with ReLU
struct Mlp : nn::Module {
  nn::Linear fc1{784, 1024}, fc2{1024, 1024}, fc3{1024, 10};
  Mlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  st::Tensor forward(const st::Tensor& x) override { return fc3(F::relu(fc2(F::relu(fc1(x))))); }
  std::string name() const override { return "Mlp"; }
};

inline nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t padding) {
  return nn::Conv2d(in, out, k, {.stride = stride, .padding = padding, .bias = false});
}

// conv 3x3 -> BN -> ReLU -> conv 3x3 -> BN, plus the input (projected by a strided 1x1 conv and
// BN when the shape changes), then ReLU: ResNet's basic block.
struct BasicBlock : nn::Module {
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1, bn2;
  nn::Sequential* downsample = nullptr;  // owned by this module when present
  BasicBlock(int64_t in, int64_t out, int64_t stride)
      : conv1(conv(in, out, 3, stride, 1)), conv2(conv(out, out, 3, 1, 1)), bn1(out), bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out)
      downsample = &register_module("downsample",
                                    std::make_unique<nn::Sequential>(conv(in, out, 1, stride, 0), nn::BatchNorm2d(out)));
  }
  st::Tensor forward(const st::Tensor& x) override {
    const st::Tensor h = bn1.forward_relu(conv1(x));
    return bn2.forward_relu(conv2(h), downsample ? (*downsample)(x) : x);
  }
  std::string name() const override { return "BasicBlock"; }
};

// (N, 3, 32, 32) -> (N, 10): conv 64 + BN + ReLU, two basic blocks each at 64, 128 (stride 2)
// and 256 (stride 2), global average pooling, fc 10.
struct Cnn : nn::Module {
  nn::Conv2d stem = conv(3, 64, 3, 1, 1);
  nn::BatchNorm2d bn{64};
  nn::Sequential layers;
  nn::AdaptiveAvgPool2d pool{1};
  nn::Linear fc{256, 10};
  Cnn() {
    register_module("stem", stem);
    register_module("bn", bn);
    int64_t in = 64;
    for (int64_t width : {64, 128, 256})
      for (int b = 0; b < 2; ++b) {
        layers.push_back(std::make_unique<BasicBlock>(in, width, b == 0 && width != 64 ? 2 : 1));
        in = width;
      }
    register_module("layers", layers);
    register_module("fc", fc);
  }
  st::Tensor forward(const st::Tensor& x) override {
    return fc(pool(layers(bn.forward_relu(stem(x)))).flatten(1));
  }
  std::string name() const override { return "Cnn"; }
};

// One model, its optimizer and one fixed batch; a step is forward, cross-entropy, zero_grad,
// backward, optimizer step. The step ends by reading the loss, which waits for a GPU.
// Without a GPU every op has finished when it returns, so the phase times are exact.
class StrataTrainer final : public Trainer {
 public:
  StrataTrainer(std::unique_ptr<nn::Module> model, bool adamw, st::Tensor x, st::Tensor y)
      : model_(std::move(model)), x_(std::move(x)), y_(std::move(y)) {
    if (adamw)
      opt_ = std::make_unique<st::optim::AdamW>(model_->parameters(),
                                                st::optim::AdamWOptions{.lr = kAdamWLr, .weight_decay = kAdamWDecay});
    else
      opt_ = std::make_unique<st::optim::SGD>(
          model_->parameters(),
          st::optim::SGDOptions{.lr = kSgdLr, .momentum = kSgdMomentum, .weight_decay = kSgdDecay});
  }
  int64_t num_parameters() const override { return model_->num_parameters(); }
  double step(double* phases) override {
    const double t0 = phases ? now_seconds() : 0;
    st::Tensor logits = (*model_)(x_);
    if (logits.dim() == 3) logits = logits.flatten(0, 1);  // (B * T, vocab)
    st::Tensor loss = F::cross_entropy(logits, y_);
    const double t1 = phases ? now_seconds() : 0;
    opt_->zero_grad();
    loss.backward();
    const double t2 = phases ? now_seconds() : 0;
    opt_->step();
    const double l = loss.item<double>();
    if (phases) phases[0] += t1 - t0, phases[1] += t2 - t1, phases[2] += now_seconds() - t2;
    return l;
  }

 private:
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<st::optim::Optimizer> opt_;
  st::Tensor x_, y_;
};

/// The strata model, optimizer and synthetic batch of a workload, on the GPU when c.cuda.
inline std::unique_ptr<Trainer> make_strata_trainer(const TrainConfig& c) {
  const st::Device dev = c.cuda ? st::Device::cuda() : st::kCPU;
  st::manual_seed(c.seed);
  st::Generator gen(c.seed);
  const int64_t B = c.batch;
  auto classes = [&](int64_t n, const st::Shape& shape) { return st::randint(0, n, shape, std::nullopt, &gen); };
  std::unique_ptr<nn::Module> model;
  st::Tensor x, y;
  bool adamw = true;
  switch (c.model) {
    case Model::Mlp:
      model = std::make_unique<Mlp>();
      x = st::randn({B, 784}, {}, &gen), y = classes(10, {B});
      break;
    case Model::Cnn:
      model = std::make_unique<Cnn>();
      x = st::randn({B, 3, 32, 32}, {}, &gen), y = classes(10, {B}), adamw = false;
      break;
    case Model::ResNet50:
      model = std::make_unique<resnet::ResNet50>();
      x = st::randn({B, 3, 224, 224}, {}, &gen), y = classes(1000, {B}), adamw = false;
      break;
    case Model::Gpt:
      model = std::make_unique<gpt::GPT>(gpt::Config{
          .vocab = kGptVocab, .context = kGptContext, .layers = kGptLayers, .width = kGptWidth, .heads = kGptHeads});
      x = classes(kGptVocab, {B, kGptContext}), y = classes(kGptVocab, {B * kGptContext});
      break;
  }
  model->to(dev);
  return std::make_unique<StrataTrainer>(std::move(model), adamw, x.to(dev), y.to(dev));
}

}  // namespace bench
